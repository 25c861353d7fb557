package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/controlplane/doctor"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
)

func TestDoctorEmbedded(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	c := cli{t: t, env: map[string]string{config.EnvDataDir: dataDir, "HOME": t.TempDir()}}

	// A fresh directory holds no deployment: doctor says so and writes
	// nothing (no secret, no state.db).
	code, out, errOut := c.run("doctor")
	if code != 1 || !strings.Contains(errOut, "no deployment in "+dataDir+" (no state.db)") {
		t.Fatalf("doctor on a fresh directory: exit %d\n%s\n%s", code, out, errOut)
	}
	if entries, err := os.ReadDir(dataDir); err != nil || len(entries) != 0 {
		t.Fatalf("doctor on a fresh directory wrote %v (%v)", entries, err)
	}
	c.fails(1, "no deployment", "doctor", "--data-dir", filepath.Join(dataDir, "typo"))
	if _, err := os.Stat(filepath.Join(dataDir, "typo")); err == nil {
		t.Fatal("doctor --data-dir made the mistyped directory")
	}

	// An empty database, not migrated: the schema check fails, and doctor
	// migrates nothing.
	if err := os.WriteFile(filepath.Join(dataDir, "state.db"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = c.run("doctor")
	if code != 1 || !strings.Contains(out, "schema") || !strings.Contains(out, "run better-compute migrate") ||
		!strings.Contains(errOut, "doctor: 1 check(s) failed") {
		t.Fatalf("doctor before migrate: exit %d\n%s\n%s", code, out, errOut)
	}
	if _, err := os.Stat(filepath.Join(dataDir, config.SecretFile)); err == nil {
		t.Fatal("doctor made a secret")
	}
	code, out, _ = c.run("doctor")
	if code != 1 || !strings.Contains(out, "run better-compute migrate") {
		t.Fatalf("doctor migrated the database: exit %d\n%s", code, out)
	}
	c.ok("migrate")

	// Migrated, never served: no bundle or sweeper yet, which warns.
	code, out, errOut = c.run("doctor", "-o", "json")
	if code != 0 {
		t.Fatalf("doctor: exit %d: %s", code, errOut)
	}
	var rep doctor.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v in %s", err, out)
	}
	if rep.Status != doctor.Warn || len(rep.Checks) != 25 {
		t.Fatalf("report = %+v", rep)
	}
	byID := map[string]doctor.Result{}
	for _, r := range rep.Checks {
		byID[r.ID] = r
	}
	for id, st := range map[string]doctor.Status{
		doctor.IDSchema: doctor.OK, doctor.IDClock: doctor.OK, doctor.IDPKI: doctor.Warn, doctor.IDGatewayIdentity: doctor.Warn,
		doctor.IDNodeCA: doctor.Warn, doctor.IDGatewayCA: doctor.Warn, doctor.IDInternalCA: doctor.Warn, doctor.IDTokenExpiry: doctor.OK,
		doctor.IDGatewayNotifier: doctor.OK, doctor.IDRoutes: doctor.OK, doctor.IDSweeper: doctor.Warn, doctor.IDHeartbeats: doctor.OK,
		// The default listens on 0.0.0.0:3000 over plain HTTP.
		doctor.IDAPITLS: doctor.Warn,
	} {
		if byID[id].Status != st {
			t.Errorf("%s = %+v, want %s", id, byID[id], st)
		}
	}

	// --strict turns the warnings into exit status 1.
	code, out, errOut = c.run("doctor", "--strict")
	if code != 1 || !strings.Contains(out, "CHECK") || !strings.Contains(out, "workers.sweeper") || !strings.Contains(errOut, "warned") {
		t.Fatalf("doctor --strict: exit %d\n%s\n%s", code, out, errOut)
	}
	c.fails(exitUsage, "--output", "doctor", "-o", "yaml")
}
