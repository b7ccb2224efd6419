package usage

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/fluidos-project/resource-broker/broker/api"
)

// TestListing: each cell is what is held against its limit, "-" where the
// operator set none; ENDED, the ended reservations kept.
func TestListing(t *testing.T) {
	q := func(s string) *resource.Quantity { return ptr.To(resource.MustParse(s)) }
	l := Listing([]api.MemberUsage{
		{Cluster: "rome", Reservations: 3, Resources: api.Quantities{CPU: q("2500m"), Memory: q("6Gi")},
			Limits: api.MemberLimits{MaxReservations: ptr.To[int64](10), MaxResources: &api.Quantities{CPU: q("8"), GPU: q("0")},
				MaxPriority: ptr.To[int32](1000), ReservesPerSecond: "20", ReserveBurst: 40}, EndedReservations: 12},
		{Cluster: "paris"},
	})
	assert.Equal(t, "member", l.Kind)
	assert.Equal(t, []string{"rome", "paris"}, l.Names)
	assert.Len(t, l.Items, 2)
	cells := func(i int) []any { return l.Table.Rows[i].Cells }
	assert.Equal(t, []any{"rome", "3/10", "2.5/8", "6Gi/-", "0/0", "1000", "20 (burst 40)", "12"}, cells(0))
	assert.Equal(t, []any{"paris", "0/-", "0/-", "0/-", "0/-", "-", "-", "0"}, cells(1))
}
