package gateway

import (
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

func TestUpgradeCommandMessage(t *testing.T) {
	t.Parallel()
	msg, err := commandMessage(&store.Command{ID: "cmd_1", Kind: "upgrade", DeadlineAt: time.Now(),
		Spec: []byte(`{"version":"0.2.0","baseUrl":"https://compute.example.com/api/downloads"}`)})
	if err != nil {
		t.Fatal(err)
	}
	up := msg.GetCommand().GetUpgrade()
	if up.GetVersion() != "0.2.0" || up.GetBaseUrl() != "https://compute.example.com/api/downloads" {
		t.Fatalf("upgrade spec %v", msg.GetCommand())
	}
	if _, err := commandMessage(&store.Command{ID: "cmd_2", Kind: "upgrade", Spec: []byte(`{"version":`)}); err == nil {
		t.Fatal("a broken spec was sent")
	}
}
