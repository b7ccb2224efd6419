package main

import (
	"encoding/json"
	"testing"

	"github.com/fluidos-project/resource-broker/internal/version"
)

func TestVersion(t *testing.T) {
	out, err := runRbctl(t, "--version")
	if err != nil {
		t.Fatal(err)
	}
	if want := "rbctl " + version.Get().String() + "\n"; out != want {
		t.Errorf("rbctl --version printed %q, want %q", out, want)
	}
}

func TestVersionCommand(t *testing.T) {
	out, err := runRbctl(t, "version")
	if err != nil {
		t.Fatal(err)
	}
	if want := "rbctl " + version.Get().String() + "\n"; out != want {
		t.Errorf("rbctl version printed %q, want %q", out, want)
	}
	out, err = runRbctl(t, "version", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct{ ClientVersion version.Info }
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("rbctl version -o json: %v\n%s", err, out)
	}
	if doc.ClientVersion != version.Get() {
		t.Errorf("rbctl version -o json: %+v, want %+v", doc.ClientVersion, version.Get())
	}
	if _, err := runRbctl(t, "version", "-o", "wide"); err == nil || err.Error() != `--output "wide": must be json or yaml` {
		t.Errorf("rbctl version -o wide: %v", err)
	}
}
