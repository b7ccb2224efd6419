package api

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"k8s.io/apimachinery/pkg/util/validation"
)

// TestIsDNS1123Subdomain holds the fast check to apimachinery's answer.
func TestIsDNS1123Subdomain(t *testing.T) {
	cases := []string{"", "a", "a.b", "a-b", "-a", "a-", "a..b", ".a", "a.", "A", "a_b", "a/b", "0", "0-0.1-1",
		"web-7d9f8-abcde", "x.y.z", strings.Repeat("a", 253), strings.Repeat("a", 254), "a.-b", "a-.b", "ä", "a b"}
	for _, s := range cases {
		assert.Equal(t, len(validation.IsDNS1123Subdomain(s)) == 0, isDNS1123Subdomain(s), "%q", s)
	}
}

func FuzzIsDNS1123Subdomain(f *testing.F) {
	for _, s := range []string{"a", "a.b", "-a", "a..b", "web-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if want := len(validation.IsDNS1123Subdomain(s)) == 0; isDNS1123Subdomain(s) != want {
			t.Fatalf("%q: %v, validation says %v", s, !want, want)
		}
	})
}
