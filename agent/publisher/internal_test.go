package publisher

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
	brokerclient "github.com/fluidos-project/resource-broker/broker/client"
)

func TestNextAligned(t *testing.T) {
	at := time.Date(2025, 3, 1, 10, 0, 29, 900e6, time.UTC)
	require.Equal(t, time.Date(2025, 3, 1, 10, 0, 30, 0, time.UTC), nextAligned(at, 30*time.Second))
	at = time.Date(2025, 3, 1, 10, 0, 30, 0, time.UTC)
	require.Equal(t, time.Date(2025, 3, 1, 10, 1, 0, 0, time.UTC), nextAligned(at, 30*time.Second), "strictly after now")
}

func TestBackoff(t *testing.T) {
	p := &Publisher{cfg: Config{MinBackoff: 100 * time.Millisecond, MaxBackoff: time.Second}}
	retryable := &brokerclient.APIError{StatusCode: 503}
	for failures, base := range map[int32]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 3: 400 * time.Millisecond, 4: 800 * time.Millisecond, 5: time.Second, 64: time.Second} {
		p.failures = failures
		for i := 0; i < 100; i++ {
			d := p.backoff(retryable)
			require.GreaterOrEqual(t, d, base, "failures %d", failures)
			require.LessOrEqual(t, d, base*3/2, "failures %d", failures)
		}
	}
	p.failures = 1
	rejected := &brokerclient.APIError{StatusCode: 400}
	require.GreaterOrEqual(t, p.backoff(rejected), time.Second, "a refusal waits MaxBackoff")

	// Over its rate, the agent waits what the broker says, within MaxBackoff.
	p.cfg.MaxBackoff = 10 * time.Second
	limited := &brokerclient.APIError{StatusCode: 429, Reason: api.ReasonRateLimited, RetryAfter: 3 * time.Second}
	require.Equal(t, 3*time.Second, p.backoff(limited), "Retry-After, past the back-off")
	limited.RetryAfter = time.Minute
	require.Equal(t, 10*time.Second, p.backoff(limited), "no longer than MaxBackoff")

	// A busy broker (503 Busy: the advertisement was shed) likewise.
	busy := &brokerclient.APIError{StatusCode: 503, Reason: api.ReasonBusy, RetryAfter: 7 * time.Second}
	require.Equal(t, 7*time.Second, p.backoff(busy), "Retry-After of a shed advertisement, past the back-off")
}

func TestClassify(t *testing.T) {
	require.Equal(t, ReasonBrokerUnavailable, classify(&brokerclient.APIError{StatusCode: 503}))
	require.Equal(t, ReasonBrokerBusy, classify(&brokerclient.APIError{StatusCode: 503, Reason: api.ReasonBusy}))
	require.Equal(t, ReasonBrokerUnavailable, classify(&brokerclient.APIError{StatusCode: 429}))
	require.Equal(t, ReasonBrokerRejected, classify(&brokerclient.APIError{StatusCode: 403}))
	require.Equal(t, ReasonBrokerUnreachable, classify(errors.New("dial tcp: connection refused")))
}

func TestToList(t *testing.T) {
	q := func(s string) *resource.Quantity { v := resource.MustParse(s); return &v }
	l := toList(&api.Quantities{CPU: q("2"), Memory: q("1Gi"), GPU: q("1")})
	require.Len(t, l, 3)
	require.Zero(t, l.Cpu().Cmp(resource.MustParse("2")))
	require.Nil(t, toList(nil))
}

func TestPricesRoundTrip(t *testing.T) {
	q := resource.MustParse("0.031")
	in := &api.Prices{Currency: "EUR", CPU: &q}
	out := toWire(rbv1.AdvertisementSpec{Prices: PricesFromWire(in)}).Prices
	require.Equal(t, in, out)
	require.Nil(t, PricesFromWire(nil))
}

// TestWithinBand: what a heartbeat may stand for.
func TestWithinBand(t *testing.T) {
	q := func(s string) *resource.Quantity { v := resource.MustParse(s); return &v }
	spec := func() rbv1.AdvertisementSpec {
		return rbv1.AdvertisementSpec{
			ClusterID: "rome", Endpoint: "https://rome:6443", Labels: map[string]string{"region": "it"},
			Capacity:    corev1.ResourceList{corev1.ResourceCPU: *q("16"), corev1.ResourceMemory: *q("64Gi")},
			Allocatable: corev1.ResourceList{corev1.ResourceCPU: *q("16"), corev1.ResourceMemory: *q("64Gi")},
			Allocated:   corev1.ResourceList{corev1.ResourceCPU: *q("4"), corev1.ResourceMemory: *q("16Gi")},
			Nodes: []rbv1.NodeResources{
				{Name: "n1", Allocatable: rbv1.NodeAmounts{CPU: q("8"), Memory: q("32Gi")}, Allocated: rbv1.NodeAmounts{CPU: q("2"), Memory: q("8Gi")}},
				{Name: "n2", Allocatable: rbv1.NodeAmounts{CPU: q("8"), Memory: q("32Gi"), GPU: q("2")}, Allocated: rbv1.NodeAmounts{CPU: q("2"), Memory: q("8Gi")}},
			},
			ReservationsOnNodes: []string{"milan/a", "milan/b"},
		}
	}
	sent := spec()
	require.True(t, withinBand(sent, spec(), DefaultBand), "the same")
	for name, c := range map[string]struct {
		change func(*rbv1.AdvertisementSpec)
		within bool
	}{
		"node cpu up 400m (5 % of 8)":        {func(s *rbv1.AdvertisementSpec) { s.Nodes[0].Allocated.CPU = q("2400m") }, true},
		"node cpu up 401m":                   {func(s *rbv1.AdvertisementSpec) { s.Nodes[0].Allocated.CPU = q("2401m") }, false},
		"node cpu down 400m":                 {func(s *rbv1.AdvertisementSpec) { s.Nodes[0].Allocated.CPU = q("1600m") }, true},
		"node memory up 1Gi (3 %)":           {func(s *rbv1.AdvertisementSpec) { s.Nodes[1].Allocated.Memory = q("9Gi") }, true},
		"node memory up 2Gi (6 %)":           {func(s *rbv1.AdvertisementSpec) { s.Nodes[1].Allocated.Memory = q("10Gi") }, false},
		"node storage appears (0 of 0)":      {func(s *rbv1.AdvertisementSpec) { s.Nodes[0].Allocated.EphemeralStorage = q("1Gi") }, false},
		"a GPU used":                         {func(s *rbv1.AdvertisementSpec) { s.Nodes[1].Allocated.GPU = q("1") }, false},
		"node allocatable":                   {func(s *rbv1.AdvertisementSpec) { s.Nodes[0].Allocatable.CPU = q("7") }, false},
		"another node":                       {func(s *rbv1.AdvertisementSpec) { s.Nodes[1].Name = "n3" }, false},
		"a node less":                        {func(s *rbv1.AdvertisementSpec) { s.Nodes = s.Nodes[:1] }, false},
		"nodes in another order":             {func(s *rbv1.AdvertisementSpec) { s.Nodes[0], s.Nodes[1] = s.Nodes[1], s.Nodes[0] }, true},
		"cluster used cpu up 800m (5 %)":     {func(s *rbv1.AdvertisementSpec) { s.Allocated[corev1.ResourceCPU] = *q("4800m") }, true},
		"cluster used cpu up 1 (6 %)":        {func(s *rbv1.AdvertisementSpec) { s.Allocated[corev1.ResourceCPU] = *q("5") }, false},
		"cluster allocatable":                {func(s *rbv1.AdvertisementSpec) { s.Allocatable[corev1.ResourceCPU] = *q("15") }, false},
		"labels":                             {func(s *rbv1.AdvertisementSpec) { s.Labels = map[string]string{"region": "fr"} }, false},
		"prices":                             {func(s *rbv1.AdvertisementSpec) { s.Prices = &rbv1.Prices{Currency: "EUR"} }, false},
		"endpoint":                           {func(s *rbv1.AdvertisementSpec) { s.Endpoint = "https://other:6443" }, false},
		"a reservation listed more":          {func(s *rbv1.AdvertisementSpec) { s.ReservationsOnNodes = append(s.ReservationsOnNodes, "milan/c") }, false},
		"a reservation listed less":          {func(s *rbv1.AdvertisementSpec) { s.ReservationsOnNodes = s.ReservationsOnNodes[:1] }, false},
		"the reservations in another order":  {func(s *rbv1.AdvertisementSpec) { s.ReservationsOnNodes = []string{"milan/b", "milan/a"} }, true},
		"one reservation listed for another": {func(s *rbv1.AdvertisementSpec) { s.ReservationsOnNodes = []string{"milan/a", "milan/c"} }, false},
	} {
		now := spec()
		c.change(&now)
		require.Equal(t, c.within, withinBand(sent, now, DefaultBand), name)
	}
	require.False(t, withinBand(sent, spec(), -1), "a negative band never holds")
}

// TestOffersNoMore: the broker's copy may stand in while the broker is too
// busy to take new figures when the cluster now uses no more than it did,
// give or take the band: a used figure may fall by any amount, but not rise
// past the band, and everything withinBand compares exactly stays exact.
func TestOffersNoMore(t *testing.T) {
	q := func(s string) *resource.Quantity { v := resource.MustParse(s); return &v }
	spec := func() rbv1.AdvertisementSpec {
		return rbv1.AdvertisementSpec{
			ClusterID: "rome", Endpoint: "https://rome:6443",
			Allocatable: corev1.ResourceList{corev1.ResourceCPU: *q("16"), corev1.ResourceMemory: *q("64Gi")},
			Allocated:   corev1.ResourceList{corev1.ResourceCPU: *q("4"), corev1.ResourceMemory: *q("16Gi")},
			Nodes: []rbv1.NodeResources{
				{Name: "n1", Allocatable: rbv1.NodeAmounts{CPU: q("8"), Memory: q("32Gi")}, Allocated: rbv1.NodeAmounts{CPU: q("2"), Memory: q("8Gi")}},
				{Name: "n2", Allocatable: rbv1.NodeAmounts{CPU: q("8"), Memory: q("32Gi"), GPU: q("2")}, Allocated: rbv1.NodeAmounts{CPU: q("2"), Memory: q("8Gi"), GPU: q("1")}},
			},
			ReservationsOnNodes: []string{"milan/a"},
		}
	}
	sent := spec()
	for name, c := range map[string]struct {
		change         func(*rbv1.AdvertisementSpec)
		within, noMore bool
	}{
		"the same":                           {func(*rbv1.AdvertisementSpec) {}, true, true},
		"node cpu down 2 (25 %)":             {func(s *rbv1.AdvertisementSpec) { s.Nodes[0].Allocated.CPU = q("0") }, false, true},
		"cluster memory down 8Gi":            {func(s *rbv1.AdvertisementSpec) { s.Allocated[corev1.ResourceMemory] = *q("8Gi") }, false, true},
		"a GPU freed":                        {func(s *rbv1.AdvertisementSpec) { s.Nodes[1].Allocated.GPU = q("0") }, false, true},
		"node cpu up 400m (the band)":        {func(s *rbv1.AdvertisementSpec) { s.Nodes[0].Allocated.CPU = q("2400m") }, true, true},
		"node cpu up 401m":                   {func(s *rbv1.AdvertisementSpec) { s.Nodes[0].Allocated.CPU = q("2401m") }, false, false},
		"one node down, another up 1 (12 %)": {func(s *rbv1.AdvertisementSpec) { s.Nodes[0].Allocated.CPU = q("0"); s.Nodes[1].Allocated.CPU = q("3") }, false, false},
		"a GPU more":                         {func(s *rbv1.AdvertisementSpec) { s.Nodes[1].Allocated.GPU = q("2") }, false, false},
		"a reservation listed less":          {func(s *rbv1.AdvertisementSpec) { s.ReservationsOnNodes = nil }, false, false},
		"node allocatable":                   {func(s *rbv1.AdvertisementSpec) { s.Nodes[0].Allocatable.CPU = q("7") }, false, false},
	} {
		now := spec()
		c.change(&now)
		require.Equal(t, c.within, withinBand(sent, now, DefaultBand), name+": within the band")
		require.Equal(t, c.noMore, offersNoMore(sent, now, DefaultBand), name+": offers no more")
	}
	require.False(t, offersNoMore(sent, spec(), -1), "a negative band never holds")
}
