package api

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRenewResponseAppendJSON(t *testing.T) {
	for _, r := range []RenewResponse{
		{},
		{Renewed: []RenewedLease{}},
		{Renewed: []RenewedLease{{ID: "a", RemainingMs: 120000}, {ID: "b.c-d", RemainingMs: -1}}},
		{Renewed: []RenewedLease{}, Refused: []RefusedRenewal{{ID: "x", Reason: RenewNotFound, Error: "no reservation x of rome (ids are scoped per requester)"}}},
		{Refused: []RefusedRenewal{{ID: "é\"<>&\\\n\x01", Reason: "R", Error: "\u2028 tab\t"}}},
	} {
		want, err := json.Marshal(r)
		require.NoError(t, err)
		assert.Equal(t, string(want), string(r.AppendJSON(nil)))
	}
}

func FuzzRenewResponseAppendJSON(f *testing.F) {
	f.Add("web-1", "no reservation", int64(5))
	f.Add("é<\"", "\x00\u2028", int64(-3))
	f.Fuzz(func(t *testing.T, id, msg string, ms int64) {
		r := RenewResponse{Renewed: []RenewedLease{{ID: id, RemainingMs: ms}}, Refused: []RefusedRenewal{{ID: msg, Reason: id, Error: msg}}}
		want, err := json.Marshal(r)
		require.NoError(t, err)
		if got := r.AppendJSON(nil); string(got) != string(want) {
			t.Fatalf("%q, json.Marshal %q", got, want)
		}
	})
}
