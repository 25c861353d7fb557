package inventory

import (
	"io/fs"
	"path"
	"strings"
)

// skippedDisk reports whether a /sys/block entry is a memory-backed or
// file-backed pseudo device rather than storage.
func skippedDisk(name string) bool {
	return strings.HasPrefix(name, "loop") || strings.HasPrefix(name, "ram") || strings.HasPrefix(name, "zram")
}

// readDisks lists /sys/block. The size file counts 512-byte sectors
// whatever the device's block size (see the kernel's
// Documentation/ABI/stable/sysfs-block).
func readDisks(root fs.FS) []Disk {
	ents, err := fs.ReadDir(root, "sys/block")
	if err != nil {
		return nil
	}
	var disks []Disk
	for _, e := range ents { // ReadDir sorts by name
		if skippedDisk(e.Name()) {
			continue
		}
		dir := path.Join("sys/block", e.Name())
		d := Disk{
			Name:       e.Name(),
			SizeBytes:  readUint(root, dir+"/size") * 512,
			Model:      readLine(root, dir+"/device/model"),
			Serial:     readLine(root, dir+"/device/serial"),
			Rotational: readLine(root, dir+"/queue/rotational") == "1",
		}
		if d.Serial == "" {
			d.Serial = vpdSerial(root, dir+"/device/vpd_pg80")
		}
		disks = append(disks, d)
	}
	return disks
}

// vpdSerial reads the unit serial number from a SCSI VPD page 0x80 (a
// 4-byte header, then the serial as ASCII), which SCSI and SATA disks
// expose instead of a serial file.
func vpdSerial(root fs.FS, name string) string {
	b, err := fs.ReadFile(root, name)
	if err != nil || len(b) < 4 || b[1] != 0x80 {
		return ""
	}
	n := int(b[2])<<8 | int(b[3])
	b = b[4:]
	if n < len(b) {
		b = b[:n]
	}
	return strings.TrimSpace(strings.Trim(string(b), "\x00"))
}
