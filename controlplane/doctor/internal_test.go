package doctor_test

import (
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/doctor"
	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/store"
)

// TestInternalAndTunnels: host.gateway.internal and host.gateway.tunnels
// for the all-in-one process, split roles without and with the internal
// control API, a certificate of another CA, a wrong address, a gateway
// without an internal address.
func TestInternalAndTunnels(t *testing.T) {
	b, err := pki.Init(pki.InitOptions{TrustDomain: "doctor.test"})
	if err != nil {
		t.Fatal(err)
	}
	other, err := pki.Init(pki.InitOptions{TrustDomain: "other.test"})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cert, key, err := bootstrap.WriteInternalCert(b, filepath.Join(dir, "good"), "gw-1", []string{"gw-1.internal"}, []net.IP{net.IPv4(127, 0, 0, 1)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	ocert, okey, err := bootstrap.WriteInternalCert(other, filepath.Join(dir, "other"), "gw-1", nil, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	live := []*store.Gateway{{ID: "gw-1", HeartbeatAt: now, InternalAddress: "127.0.0.1:8444"}}
	good := doctor.InternalConfig{CertFile: cert, KeyFile: key, Address: "gw-1.internal:8444", SplitRoles: true}

	want(t, doctor.Internal(b, doctor.InternalConfig{}, nil, now, time.Minute), doctor.IDGatewayInternal, doctor.OK, "wakes in memory")
	want(t, doctor.Internal(b, doctor.InternalConfig{SplitRoles: true}, nil, now, time.Minute), doctor.IDGatewayInternal, doctor.OK, "LISTEN/NOTIFY")
	want(t, doctor.Internal(b, good, live, now, time.Minute), doctor.IDGatewayInternal, doctor.OK, "certificate verifies")
	want(t, doctor.Internal(b, doctor.InternalConfig{CertFile: ocert, KeyFile: okey, SplitRoles: true}, live, now, time.Minute),
		doctor.IDGatewayInternal, doctor.Fail, "does not verify")
	bad := good
	bad.Address = "elsewhere.example:8444"
	want(t, doctor.Internal(b, bad, live, now, time.Minute), doctor.IDGatewayInternal, doctor.Fail, "does not name elsewhere.example")
	want(t, doctor.Internal(b, good, []*store.Gateway{{ID: "gw-2", HeartbeatAt: now}}, now, time.Minute), doctor.IDGatewayInternal, doctor.Warn, "serve no internal control API")
	// One configuration for every process (issue 41): the api's own
	// certificate need not name the gateway's address, the gateway's
	// must; a worker process uses no internal control API.
	apiOnly := bad
	apiOnly.Roles = []string{"api"}
	want(t, doctor.Internal(b, apiOnly, live, now, time.Minute), doctor.IDGatewayInternal, doctor.OK, "certificate verifies")
	gwOnly := bad
	gwOnly.Roles = []string{"gateway"}
	want(t, doctor.Internal(b, gwOnly, live, now, time.Minute), doctor.IDGatewayInternal, doctor.Fail, "does not name elsewhere.example")
	workers := doctor.InternalConfig{SplitRoles: true, Roles: []string{"controllers", "scheduler", "sinks", "iam"}}
	want(t, doctor.Internal(b, workers, live, now, time.Minute), doctor.IDGatewayInternal, doctor.OK, "neither the api nor the gateway")
	want(t, doctor.Tunnels(workers), doctor.IDGatewayTunnels, doctor.OK, "neither the api nor the gateway")

	// After an internal-CA rotation the files still hold the old CA's
	// certificate: it works (re-issued in memory), and wants renewing.
	rotated, err := pki.UnmarshalBundle(mustMarshal(t, b))
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []func() error{func() error { return rotated.PrepareInternalCA(now, 0) }, rotated.ActivateInternalCA, rotated.RetireInternalCA} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	want(t, doctor.Internal(rotated, good, live, now, time.Minute), doctor.IDGatewayInternal, doctor.Warn, "another internal CA of the trust domain")
	want(t, doctor.Internal(rotated, doctor.InternalConfig{CertFile: ocert, KeyFile: okey, SplitRoles: true}, live, now, time.Minute),
		doctor.IDGatewayInternal, doctor.Fail, "does not verify")

	want(t, doctor.Tunnels(doctor.InternalConfig{}), doctor.IDGatewayTunnels, doctor.OK, "own process")
	want(t, doctor.Tunnels(doctor.InternalConfig{SplitRoles: true}), doctor.IDGatewayTunnels, doctor.Warn, "are refused")
	want(t, doctor.Tunnels(good), doctor.IDGatewayTunnels, doctor.OK, "internal control API")
}

func mustMarshal(t *testing.T, b *pki.Bundle) []byte {
	t.Helper()
	raw, err := b.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return raw
}
