package main

import (
	"errors"
	"fmt"
	"net"
	"syscall"
)

// listenFlag names the flag that moves one listener: its configured
// address (host:port, as config.Host.Listen) and the advice to give.
type listenFlag struct {
	addr   string
	advice string
}

// portInUse adds to err, when a listener could not bind because its
// address is in use, which flag moves that listener (issue 51: a port
// already in use names the flag to change it). The listener is found by
// the port of the address that failed (net.OpError.Addr), not by the
// error's text; err is returned as it is otherwise.
func portInUse(err error, flags ...listenFlag) error {
	var op *net.OpError
	if err == nil || !errors.Is(err, syscall.EADDRINUSE) || !errors.As(err, &op) || op.Addr == nil {
		return err
	}
	_, port, perr := net.SplitHostPort(op.Addr.String())
	if perr != nil {
		return err
	}
	for _, f := range flags {
		if _, p, e := net.SplitHostPort(f.addr); e == nil && p == port {
			return fmt.Errorf("%w: port %s is in use (another better-compute?); %s", err, port, f.advice)
		}
	}
	return err
}
