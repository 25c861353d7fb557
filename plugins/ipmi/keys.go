package ipmi

// Attribute keys of this package's log records.
const (
	keyBMC      = "bmc"
	keyOp       = "op"
	keyProvider = "provider"
	keyReason   = "reason"
	keyTook     = "took"
)
