// Package inventory reads what a machine is: CPU, memory, disks, network
// interfaces, operating system and kernel, firmware (DMI) identity, boot
// and machine ids, and, through an optional [GPUCollector] (package
// bcd/inventory/gpu), its NVIDIA GPUs. bcd sends the result to the control
// plane in its Inventory message.
//
// [Scanner.Scan] reads Linux's own files and nothing else:
//
//	Host field        source
//	Hostname          /proc/sys/kernel/hostname
//	MachineID         /etc/machine-id (or /var/lib/dbus/machine-id)
//	BootID            /proc/sys/kernel/random/boot_id
//	UptimeSeconds     /proc/uptime
//	OS.Name, Version  /etc/os-release NAME, VERSION_ID (or /usr/lib/os-release)
//	OS.Kernel         /proc/sys/kernel/osrelease (uname -r)
//	CPU               /proc/cpuinfo
//	Memory            /proc/meminfo MemTotal, MemAvailable
//	Disks             /sys/block/*/{size,queue/rotational,device/model,device/serial}
//	                  (serial from device/vpd_pg80 when there is no serial file);
//	                  loop, ram and zram devices are skipped
//	NICs              /sys/class/net/*/{address,speed,device/driver}, and
//	                  addresses from the kernel (net.Interfaces)
//	DMI               /sys/class/dmi/id/{sys_vendor,product_name,product_serial,bios_version}
//
// The file system is injectable ([Config].Root) so tests run against
// fixture trees. A file that is missing or unreadable (DMI serials without
// root, DMI in containers and on arm64) leaves its field empty; it is never
// an error.
//
// [Host.Digest] fingerprints an inventory without its volatile fields, so
// the daemon re-sends the inventory only when the machine changed.
package inventory
