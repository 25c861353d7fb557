package session

import (
	"errors"
	"fmt"

	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Bounds on what a gateway sends, the counterpart of the gateway's bounds
// on what a node sends (issue 29; issue 28 sets the numbers): bcd refuses
// a message whose fields are out of range rather than keep or act on them.
const (
	// MaxGatewayList is the most gateway URLs bcd takes from one Welcome,
	// Drain or Join answer, and keeps at all.
	MaxGatewayList = 64
	// MaxGatewayURLBytes is the longest gateway URL bcd takes.
	MaxGatewayURLBytes = 2048
	// MaxIDBytes is the longest id (command, tunnel, session) bcd takes.
	MaxIDBytes = 128
)

// errOutOfRange marks a gateway message bcd refused for a field out of
// range.
var errOutOfRange = errors.New("field out of range")

// checkGatewayList reports whether urls is within the bounds.
func checkGatewayList(field string, urls []string) error {
	if len(urls) > MaxGatewayList {
		return fmt.Errorf("%w: %s lists %d gateways, at most %d", errOutOfRange, field, len(urls), MaxGatewayList)
	}
	for _, u := range urls {
		if len(u) > MaxGatewayURLBytes {
			return fmt.Errorf("%w: %s holds a URL of %d bytes, at most %d", errOutOfRange, field, len(u), MaxGatewayURLBytes)
		}
	}
	return nil
}

// checkID reports whether id, named field, is present and within the bound.
func checkID(field, id string) error {
	if id == "" || len(id) > MaxIDBytes {
		return fmt.Errorf("%w: %s of %d bytes, want 1 to %d", errOutOfRange, field, len(id), MaxIDBytes)
	}
	return nil
}

// checkGatewayMessage checks the fields of msg that bcd keeps or acts on.
func checkGatewayMessage(msg *sessionv1.GatewayMessage) error {
	switch b := msg.GetBody().(type) {
	case *sessionv1.GatewayMessage_Welcome:
		if err := checkID("welcome session id", b.Welcome.GetSessionId()); err != nil {
			return err
		}
		return checkGatewayList("welcome gateways", b.Welcome.GetGateways())
	case *sessionv1.GatewayMessage_Command:
		return checkID("command id", b.Command.GetId())
	case *sessionv1.GatewayMessage_Cancel:
		return checkID("cancel command id", b.Cancel.GetCommandId())
	case *sessionv1.GatewayMessage_Drain:
		return checkGatewayList("drain prefer gateways", b.Drain.GetPreferGateways())
	case *sessionv1.GatewayMessage_TunnelOpen:
		return checkID("tunnel id", b.TunnelOpen.GetTunnelId())
	}
	return nil
}
