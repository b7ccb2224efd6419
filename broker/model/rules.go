package model

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// ValidateClusterID checks a cluster identity, the common name of its client
// certificate: a DNS-1123 label, because it names the tenant namespace
// (rb-<id>) and Redis keys.
func ValidateClusterID(id string) error {
	if msgs := validation.IsDNS1123Label(id); len(msgs) > 0 {
		return fmt.Errorf("invalid cluster id %q: must be a DNS-1123 label because it becomes a namespace name: %s",
			id, strings.Join(msgs, "; "))
	}
	return nil
}

// IsCurrencyCode reports whether s has the shape of an ISO 4217 code: three
// upper-case letters.
func IsCurrencyCode(s string) bool {
	if len(s) != 3 {
		return false
	}
	for _, c := range s {
		if c < 'A' || c > 'Z' {
			return false
		}
	}
	return true
}
