package bmcsecret

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

const pw = "s3cr3t-Pa55-x9"

func TestRoundTrip(t *testing.T) {
	c := &Credentials{Address: "10.1.2.3", Username: "admin", Password: pw, Providers: []string{"redfish", "ipmitool"},
		Timeout: "5s", IPMIPort: 6230, IPMICipherSuite: "17"}
	b, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	got, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.Password != pw || got.IPMIPort != 6230 || got.Providers[0] != "redfish" {
		t.Fatalf("round trip: %#v", got)
	}
	if d, _ := got.TimeoutDuration(); d.Seconds() != 5 {
		t.Fatalf("timeout %v", d)
	}
	if Name("node_x") != "bmc/node_x" {
		t.Fatal(Name("node_x"))
	}
}

func TestPrintingLeavesOutThePassword(t *testing.T) {
	c := Credentials{Address: "10.1.2.3", Username: "admin", Password: pw}
	var buf bytes.Buffer
	slog.New(slog.NewTextHandler(&buf, nil)).Info("x", "creds", c, "ptr", &c)
	for _, s := range []string{fmt.Sprint(c), fmt.Sprintf("%v %+v %#v", c, &c, c), buf.String()} {
		if strings.Contains(s, pw) {
			t.Errorf("printed the password: %s", s)
		}
	}
}

func TestInvalid(t *testing.T) {
	for name, c := range map[string]Credentials{
		"no address":    {Username: "u", Password: pw},
		"scheme":        {Address: "https://10.0.0.1", Username: "u", Password: pw},
		"port":          {Address: "bmc.example.com:623", Username: "u", Password: pw},
		"no username":   {Address: "10.0.0.1", Password: pw},
		"no password":   {Address: "10.0.0.1", Username: "u"},
		"provider":      {Address: "10.0.0.1", Username: "u", Password: pw, Providers: []string{"snmp"}},
		"twice":         {Address: "10.0.0.1", Username: "u", Password: pw, Providers: []string{"redfish", "redfish"}},
		"timeout":       {Address: "10.0.0.1", Username: "u", Password: pw, Timeout: "1h"},
		"cipher suite":  {Address: "10.0.0.1", Username: "u", Password: pw, IPMICipherSuite: "x"},
		"newline in pw": {Address: "10.0.0.1", Username: "u", Password: pw + "\n"},
	} {
		err := c.Validate()
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		} else if strings.Contains(err.Error(), pw) {
			t.Errorf("%s: error holds the password: %v", name, err)
		}
	}
	if err := (&Credentials{Address: "fe80::1", Username: "u", Password: pw}).Validate(); err != nil {
		t.Errorf("IPv6 address: %v", err)
	}
	if _, err := Parse([]byte(`{"address":"10.0.0.1","username":"u","password":"` + pw + `","extra":1}`)); !errors.Is(err, ErrInvalid) || strings.Contains(err.Error(), pw) {
		t.Errorf("unknown field: %v", err)
	}
}
