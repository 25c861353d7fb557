package doctor

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// LocalClock reads the kernel's clock discipline (adjtimex, read only): a
// clock that no NTP daemon synchronises (STA_UNSYNC, or the TIME_ERROR
// state) warns, since nothing keeps it from drifting away from the gateways'.
func LocalClock() Result {
	var tx unix.Timex
	state, err := unix.Adjtimex(&tx)
	if err != nil {
		return result(IDClock, "", Warn, "cannot read the clock's synchronisation state", err.Error())
	}
	maxErr := time.Duration(tx.Maxerror) * time.Microsecond
	detail := fmt.Sprintf("kernel state %d, maximum error %s, estimated error %s", state, maxErr, time.Duration(tx.Esterror)*time.Microsecond)
	if state == unix.TIME_ERROR || tx.Status&unix.STA_UNSYNC != 0 {
		return result(IDClock, "", Warn, "this machine's clock is not synchronised: run an NTP daemon (chrony, systemd-timesyncd)", detail)
	}
	return result(IDClock, "", OK, "this machine's clock is synchronised (NTP)", detail)
}
