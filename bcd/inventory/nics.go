package inventory

import (
	"io/fs"
	"path"
	"strconv"
)

// readNICs lists /sys/class/net: every interface, virtual ones included,
// with its MAC address, link speed and driver. Addresses are filled in by
// the Scanner.
func readNICs(root fs.FS) []NIC {
	ents, err := fs.ReadDir(root, "sys/class/net")
	if err != nil {
		return nil
	}
	var nics []NIC
	for _, e := range ents { // ReadDir sorts by name
		dir := path.Join("sys/class/net", e.Name())
		// Entries are symbolic links to the device directories; a plain
		// file here (bonding_masters) is not an interface.
		if _, err := fs.Stat(root, dir+"/address"); err != nil {
			if _, err := fs.Stat(root, dir+"/ifindex"); err != nil {
				continue
			}
		}
		n := NIC{Name: e.Name(), MAC: readLine(root, dir+"/address")}
		// speed is -1 or unreadable (EINVAL) when the link is down or the
		// driver does not know.
		if v, err := strconv.ParseInt(readLine(root, dir+"/speed"), 10, 64); err == nil && v > 0 && v <= 1<<32-1 {
			n.SpeedMbps = uint32(v)
		}
		if target, err := fs.ReadLink(root, dir+"/device/driver"); err == nil {
			n.Driver = path.Base(target)
		}
		nics = append(nics, n)
	}
	return nics
}
