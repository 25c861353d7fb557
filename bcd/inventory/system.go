package inventory

import (
	"bufio"
	"bytes"
	"io/fs"
	"strconv"
	"strings"
)

// readLine returns the first line of the file at name, trimmed of spaces,
// or "" when it cannot be read.
func readLine(root fs.FS, name string) string {
	b, err := fs.ReadFile(root, name)
	if err != nil {
		return ""
	}
	line, _, _ := bytes.Cut(b, []byte{'\n'})
	return strings.TrimSpace(string(line))
}

// firstLine returns readLine of the first name that gives a non-empty
// line.
func firstLine(root fs.FS, names ...string) string {
	for _, n := range names {
		if v := readLine(root, n); v != "" {
			return v
		}
	}
	return ""
}

// readUint returns the file's first line as an unsigned integer, or 0.
func readUint(root fs.FS, name string) uint64 {
	v, err := strconv.ParseUint(readLine(root, name), 10, 64)
	if err != nil {
		return 0
	}
	return v
}

// readUptime returns whole seconds since boot from /proc/uptime
// ("12345.67 23456.78").
func readUptime(root fs.FS) uint64 {
	f, _, _ := strings.Cut(readLine(root, "proc/uptime"), " ")
	secs, _, _ := strings.Cut(f, ".")
	v, err := strconv.ParseUint(secs, 10, 64)
	if err != nil {
		return 0
	}
	return v
}

// readOS reads /etc/os-release (falling back to /usr/lib/os-release, as
// os-release(5) says) and the kernel release.
func readOS(root fs.FS) OS {
	o := OS{Kernel: readLine(root, "proc/sys/kernel/osrelease")}
	b, err := fs.ReadFile(root, "etc/os-release")
	if err != nil {
		if b, err = fs.ReadFile(root, "usr/lib/os-release"); err != nil {
			return o
		}
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "=")
		if !ok {
			continue
		}
		v = unquote(v)
		switch k {
		case "NAME":
			o.Name = v
		case "VERSION_ID":
			o.Version = v
		}
	}
	return o
}

// unquote removes os-release(5) shell quoting from a value.
func unquote(v string) string {
	if len(v) < 2 {
		return v
	}
	switch q := v[0]; {
	case q == '\'' && v[len(v)-1] == q:
		return v[1 : len(v)-1]
	case q == '"' && v[len(v)-1] == q:
		return strings.NewReplacer(`\"`, `"`, `\\`, `\`, "\\`", "`", `\$`, `$`).Replace(v[1 : len(v)-1])
	default:
		return v
	}
}

// readMemory reads MemTotal and MemAvailable (in KiB) from /proc/meminfo.
func readMemory(root fs.FS) Memory {
	var m Memory
	b, err := fs.ReadFile(root, "proc/meminfo")
	if err != nil {
		return m
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		var dst *uint64
		switch k {
		case "MemTotal":
			dst = &m.TotalBytes
		case "MemAvailable":
			dst = &m.AvailableBytes
		default:
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err == nil {
			*dst = n * 1024
		}
	}
	return m
}

// readDMI reads /sys/class/dmi/id.
func readDMI(root fs.FS) DMI {
	const dir = "sys/class/dmi/id/"
	return DMI{
		SystemVendor:  readLine(root, dir+"sys_vendor"),
		ProductName:   readLine(root, dir+"product_name"),
		ProductSerial: readLine(root, dir+"product_serial"),
		BIOSVersion:   readLine(root, dir+"bios_version"),
	}
}
