package main

import (
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
