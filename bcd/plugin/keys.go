package plugin

// Attribute keys of this package's log records.
const (
	keyPlugin   = "plugin"
	keyPath     = "path"
	keyPID      = "pid"
	keyVersion  = "version"
	keyRetryIn  = "retry_in"
	keyFailures = "failures"
	keyLogger   = "logger"
)
