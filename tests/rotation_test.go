package tests

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pki"
)

// rotationView is `pki rotate node-ca status -o json`'s rotation.
type rotationView struct {
	Rotation struct {
		ID            string  `json:"id"`
		Phase         string  `json:"phase"`
		NewCAID       string  `json:"newCaId"`
		OldCAID       string  `json:"oldCaId"`
		Threshold     float64 `json:"threshold"`
		LiveNodes     int     `json:"liveNodes"`
		AckedNodes    int     `json:"ackedNodes"`
		NodesOffNewCA int     `json:"nodesOffNewCa"`
		Ready         bool    `json:"ready"`
		Waiting       string  `json:"waiting"`
	} `json:"rotation"`
}

// readCertsPEM reads the PEM certificates of a file in m's data dir.
func readCertsPEM(t *testing.T, m *machine, name string) []*x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(m.dataDir, name))
	if err != nil {
		t.Fatal(err)
	}
	var out []*x509.Certificate
	for {
		var blk *pem.Block
		if blk, b = pem.Decode(b); blk == nil {
			return out
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
}

// TestNodeCARotationRealBcd rotates the node CA of a deployment with a real
// bcd whose certificates live 10 s, through the CLI: start, the node stores
// the new bundle in its data dir and acks it (status counts it), advance
// activates at the threshold, the node's next renewal brings a certificate
// from the new CA (read from its data dir), advance retires, and status
// ends "retired" on the same session throughout.
func TestNodeCARotationRealBcd(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := context.Background()
		d := newDeploymentWith(t, backend, shortCerts)
		tokenFile, _ := d.joinToken(1, time.Hour)
		m := newMachine(t, "rotate-01")
		id := m.mustJoin(d.gatewayURL, tokenFile)
		p := m.node()
		sid := p.WaitLine(sessionEstablishedID, 30*time.Second)[1]
		eventually(t, 10*time.Second, func() bool {
			s, err := d.st.SessionGet(ctx, id)
			return err == nil && s.SessionID == sid
		}, func() string { return "no sessions row with bcd's session " + sid })
		status := func() rotationView {
			var v rotationView
			d.cliJSON(&v, d.viaAPI("pki", "rotate", "node-ca", "status")...)
			return v
		}

		var v rotationView
		d.cliJSON(&v, d.viaAPI("pki", "rotate", "node-ca", "start", "--reason", "test")...)
		if v.Rotation.Phase != "propagating" || v.Rotation.Threshold != 0.99 {
			t.Fatalf("start: %+v", v.Rotation)
		}
		eventually(t, 30*time.Second, func() bool {
			v = status()
			return v.Rotation.LiveNodes == 1 && v.Rotation.AckedNodes == 1
		}, func() string { return fmt.Sprintf("status never counted the node's ack: %+v", v.Rotation) })
		if roots := readCertsPEM(t, m, "node-ca.crt"); len(roots) != 2 || pki.NodeCAID(roots[1]) != v.Rotation.NewCAID {
			t.Fatalf("node-ca.crt in the data dir holds %d roots, want the old and the new (%s)", len(roots), v.Rotation.NewCAID)
		}
		// status prints the phase as one word first.
		if out := d.cli(d.viaAPI("pki", "rotate", "node-ca", "status")...); strings.SplitN(out, "\n", 2)[0] != "propagating" {
			t.Fatalf("status's first line %q, want propagating", strings.SplitN(out, "\n", 2)[0])
		}

		d.cliJSON(&v, d.viaAPI("pki", "rotate", "node-ca", "advance")...)
		if v.Rotation.Phase != "activated" {
			t.Fatalf("advance at 1 of 1 acks: %+v", v.Rotation)
		}
		newCA := v.Rotation.NewCAID
		eventually(t, 60*time.Second, func() bool { return nodeIssuerIs(t, m, newCA) },
			func() string { return "the certificate in the node's data dir never came from the new CA " + newCA })
		eventually(t, 30*time.Second, func() bool {
			v = status()
			return v.Rotation.Ready
		}, func() string { return fmt.Sprintf("activated rotation never ready to retire: %+v", v.Rotation) })
		d.cliJSON(&v, d.viaAPI("pki", "rotate", "node-ca", "advance")...)
		if v.Rotation.Phase != "retired" {
			t.Fatalf("advance with every node on the new CA: %+v", v.Rotation)
		}
		if out := d.cli(d.viaAPI("pki", "rotate", "node-ca", "status")...); strings.SplitN(out, "\n", 2)[0] != "retired" {
			t.Fatalf("status's first line %q, want retired", strings.SplitN(out, "\n", 2)[0])
		}
		// One session throughout: renewals and the rotation dropped none.
		s, err := d.st.SessionGet(ctx, id)
		if err != nil || s.SessionID != sid {
			t.Fatalf("after the rotation the node's session is %+v (%v), want %s", s, err, sid)
		}
		if n := countLines(p, sessionEstablished); n != 1 {
			t.Fatalf("bcd established %d sessions, want 1", n)
		}
	})
}

// nodeIssuerIs reports whether the certificate in m's data dir verifies
// against the node CA root with id caID from its node-ca.crt.
func nodeIssuerIs(t *testing.T, m *machine, caID string) bool {
	t.Helper()
	leaf := readCertsPEM(t, m, "node.crt")[0]
	for _, r := range readCertsPEM(t, m, "node-ca.crt") {
		if pki.NodeCAID(r) == caID && leaf.CheckSignatureFrom(r) == nil {
			return true
		}
	}
	return false
}
