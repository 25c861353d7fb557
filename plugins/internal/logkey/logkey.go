// Package logkey holds the log attribute keys of the bcx-* plugins: one
// spelling of each (tests/logkeys_test.go refuses another spelling, or the
// same one written out). The plugins log through go-plugin's hclog to bcd,
// whose keys (bcd/internal/logkey) they spell the same way.
package logkey

// Keys shared by the plugins.
const (
	// Err is an error value.
	Err = "err"
)
