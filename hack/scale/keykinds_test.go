package main

import "testing"

func TestKeyKind(t *testing.T) {
	for key, want := range map[string]string{
		"rb:{b}:resv:c00001/lease-7":   "resv",
		"rb:{b}:idx:free:cpu":          "idx:free",
		"rb:{b}:idx:rec":               "idx:rec",
		"rb:{b}:rate:renewals:c00001":  "rate",
		"rb:{eu}:events:c00002":        "events",
		"rb:{b}:expiry":                "expiry",
		"rb:{b}:grant:c00001:c00002":   "grant",
		"rb:{b}:spread:c00001/web/x:y": "spread",
	} {
		if got := keyKind(key); got != want {
			t.Errorf("keyKind(%q) = %q, want %q", key, got, want)
		}
	}
}

func TestLeaseMemory(t *testing.T) {
	before := map[string]*KindMemory{"cluster": {Kind: "cluster", Keys: 2, Bytes: 1000}, "gone": {Kind: "gone", Keys: 1, Bytes: 50}}
	after := map[string]*KindMemory{"cluster": {Kind: "cluster", Keys: 2, Bytes: 1100}, "resv": {Kind: "resv", Keys: 10, Bytes: 5000}}
	got := leaseMemory(before, after, 10_000, 16_500, 10)
	want := map[string]int64{"resv": 5000, "cluster": 100, "gone": -50, "(other)": 1450}
	if len(got) != len(want) {
		t.Fatalf("got %d kinds %+v, want %d", len(got), got, len(want))
	}
	for _, k := range got {
		if k.BytesAdded != want[k.Kind] || k.BytesPerLease != float64(want[k.Kind])/10 {
			t.Errorf("%s: added %d (%.1f per lease), want %d", k.Kind, k.BytesAdded, k.BytesPerLease, want[k.Kind])
		}
	}
	if got[0].Kind != "resv" {
		t.Errorf("largest first: got %s first", got[0].Kind)
	}
}
