package publisher

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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
