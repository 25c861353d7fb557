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

	"github.com/better-compute/better-compute/controlplane/pkg/pki"
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
// bcd whose certificates live 10 s: an operator starts it with the CLI, and
// nothing else. The node stores the new bundle in its data dir and acks it
// (status counts it), the reconciler activates the rotation at the
// threshold, the node's next renewal brings a certificate from the new CA
// (read from its data dir), the reconciler retires the old CA, and status
// ends "retired", on the same session throughout.
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
		firstLine := func() string {
			return strings.SplitN(d.cli(d.viaAPI("pki", "rotate", "node-ca", "status")...), "\n", 2)[0]
		}

		var v rotationView
		d.cliJSON(&v, d.viaAPI("pki", "rotate", "node-ca", "start", "--reason", "test")...)
		if v.Rotation.Phase != "propagating" || v.Rotation.Threshold != 0.99 {
			t.Fatalf("start: %+v", v.Rotation)
		}
		newCA := v.Rotation.NewCAID
		eventually(t, 30*time.Second, func() bool {
			v = status()
			return v.Rotation.LiveNodes == 1 && v.Rotation.AckedNodes == 1
		}, func() string { return fmt.Sprintf("status never counted the node's ack: %+v", v.Rotation) })
		stored := false
		for _, r := range readCertsPEM(t, m, "node-ca.crt") {
			stored = stored || pki.NodeCAID(r) == newCA
		}
		if !stored {
			t.Fatalf("node-ca.crt in the data dir does not hold the new CA %s", newCA)
		}
		eventually(t, 30*time.Second, func() bool { v = status(); return v.Rotation.Phase != "propagating" },
			func() string { return fmt.Sprintf("the reconciler never activated at 1 of 1 acks: %+v", v.Rotation) })
		eventually(t, 60*time.Second, func() bool { return nodeIssuerIs(t, m, newCA) },
			func() string { return "the certificate in the node's data dir never came from the new CA " + newCA })
		eventually(t, 60*time.Second, func() bool { return firstLine() == "retired" },
			func() string { return fmt.Sprintf("status never ended retired: %+v", status().Rotation) })
		// One session throughout: renewals and the rotation dropped none.
		s, err := d.st.SessionGet(ctx, id)
		if err != nil || s.SessionID != sid {
			t.Fatalf("after the rotation the node's session is %+v (%v), want %s", s, err, sid)
		}
		if n := countLines(p, sessionEstablished); n != 1 {
			t.Fatalf("bcd established %d sessions, want 1", n)
		}
		var audit []string
		for _, a := range []string{"pki.rotation.started", "pki.rotation.activated", "pki.rotation.retired"} {
			if len(auditRows(t, d, a)) == 1 {
				audit = append(audit, a)
			}
		}
		if len(audit) != 3 {
			t.Fatalf("audit rows of the phases: %q, want one each of started, activated, retired", audit)
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
