package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
	"github.com/fluidos-project/resource-broker/internal/rbctl/describe"
	"github.com/fluidos-project/resource-broker/internal/rbctl/get"
	"github.com/fluidos-project/resource-broker/internal/rbctl/output"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden with rbctl's current output")

// golden compares got with testdata/<name>.golden (or writes it, -update).
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		require.NoError(t, os.MkdirAll("testdata", 0o755))
		require.NoError(t, os.WriteFile(path, got, 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run go test ./cmd/rbctl -run TestOperatorOutput -update to write it")
	assert.Equal(t, string(want), string(got), "rbctl's output differs from %s (-update rewrites it)", path)
}

// goldenNow is the fixed "now" of the golden outputs.
var goldenNow = time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)

func goldenClusters() []api.Cluster {
	free := func(cpu, mem, gpu string) *api.Quantities { q := brokertest.Quantities(cpu, mem, gpu); return &q }
	return []api.Cluster{
		{ClusterID: "berlin", Labels: map[string]string{"zone": "eu-central", "gpu": "a100"}, Live: true, SeenAt: goldenNow.Add(-4 * time.Second),
			Resources: api.ClusterResources{Allocatable: brokertest.Quantities("8", "32Gi", "2"), Available: free("8", "32Gi", "2"), Reserved: free("0", "0", "0")},
			Prices:    &api.Prices{Currency: "EUR", CPU: brokertest.MustQ("50m"), Memory: brokertest.MustQ("5m")}},
		{ClusterID: "oslo", Live: false, SeenAt: goldenNow.Add(-3 * time.Hour),
			Resources: api.ClusterResources{Allocatable: brokertest.Quantities("4", "8Gi", ""), Available: free("4", "8Gi", "")}},
		{ClusterID: "paris", Labels: map[string]string{"zone": "eu-west"}, Live: true, SeenAt: goldenNow.Add(-2 * time.Second),
			Resources: api.ClusterResources{Allocatable: brokertest.Quantities("16", "64Gi", ""), Available: free("13500m", "59904Mi", ""), Reserved: free("2500m", "4Gi", "")},
			Prices:    &api.Prices{Currency: "EUR", CPU: brokertest.MustQ("30m")}},
	}
}

func goldenReservation() api.Reservation {
	return api.Reservation{ID: "0b6f7a52-2d8e-4b7c-9f43-1c1f1a0e5d21", Requester: "rome", Provider: "paris", Phase: "Reserved",
		Resources: brokertest.Quantities("2", "4Gi", ""), Score: 93.44, Price: 76000, Owner: "demo/big",
		CreatedAt: goldenNow.Add(-5 * time.Minute), ExpiresAt: goldenNow.Add(55 * time.Minute), RemainingMs: (55 * time.Minute).Milliseconds(),
		Lease: "2m0s",
		Candidates: []api.Candidate{
			{Cluster: "paris", Score: 93.44, ResourceScore: 90.63, CostScore: 100, Price: 76000},
			{Cluster: "berlin", Score: 63.44, ResourceScore: 90.63, CostScore: 0, Price: 116000},
		}}
}

func goldenObject() *v1alpha1.Reservation {
	return &v1alpha1.Reservation{
		ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "big-x7k2p", UID: "u1"},
		Spec:       v1alpha1.ReservationSpec{PodName: "big"},
		Status: v1alpha1.ReservationStatus{Phase: v1alpha1.ReservationActive, ReservationID: goldenReservation().ID, Provider: "paris",
			VirtualNode: "rb-paris", Conditions: []metav1.Condition{
				{Type: "Reserved", Status: metav1.ConditionTrue, Reason: "Reserved", Message: "paris holds 2 CPU, 4Gi", LastTransitionTime: metav1.NewTime(goldenNow.Add(-5 * time.Minute))},
				{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Granted", Message: "paris granted access", LastTransitionTime: metav1.NewTime(goldenNow.Add(-4 * time.Minute))},
			}},
	}
}

// TestOperatorOutput: rbctl's tables, names, JSON, YAML, jsonpath and
// descriptions, byte for byte (testdata/*.golden).
func TestOperatorOutput(t *testing.T) {
	print := func(t *testing.T, p output.Flags, l output.Listing) []byte {
		t.Helper()
		require.NoError(t, p.Validate())
		var out, errOut bytes.Buffer
		require.NoError(t, p.Print(&out, &errOut, l))
		return append(out.Bytes(), errOut.Bytes()...)
	}
	clusters := get.ClusterListing(goldenClusters(), goldenNow)
	for name, p := range map[string]output.Flags{
		"get-clusters":            {},
		"get-clusters-wide":       {Output: "wide"},
		"get-clusters-no-headers": {NoHeaders: true},
		"get-clusters-name":       {Output: "name"},
		"get-clusters-json":       {Output: "json"},
		"get-clusters-yaml":       {Output: "yaml"},
		"get-clusters-jsonpath":   {Output: `jsonpath={range .items[*]}{.clusterID}{"\t"}{.live}{"\n"}{end}`},
	} {
		t.Run(name, func(t *testing.T) { golden(t, name, print(t, p, clusters)) })
	}

	one := get.ClusterListing(goldenClusters()[2:], goldenNow)
	one.Single = true
	t.Run("get-cluster-paris-json", func(t *testing.T) { golden(t, "get-cluster-paris-json", print(t, output.Flags{Output: "json"}, one)) })

	r := goldenReservation()
	ended := api.Reservation{ID: "gone-uid", Phase: "Released", Requester: "rome", Provider: "berlin", Resources: brokertest.Quantities("1", "1Gi", ""),
		PreemptedBy: "milan/urgent-1"}
	endedObj := &v1alpha1.Reservation{ObjectMeta: metav1.ObjectMeta{Namespace: "batch", Name: "job-1"}}
	member := r
	member.ID, member.Group = "train-0-uid", "batch/train"
	memberObj := &v1alpha1.Reservation{ObjectMeta: metav1.ObjectMeta{Namespace: "batch", Name: "train-0-k2x9q"}}
	rows := []get.ReservationRow{{Reservation: ended, Object: endedObj}, {Reservation: member, Object: memberObj}, {Reservation: r, Object: goldenObject()}}
	for name, p := range map[string]output.Flags{
		"get-reservations-all-namespaces":      {},
		"get-reservations-all-namespaces-wide": {Output: "wide"},
	} {
		t.Run(name, func(t *testing.T) { golden(t, name, print(t, p, get.ReservationListing(rows, true))) })
	}
	provided := []get.ReservationRow{{Reservation: r}}
	t.Run("get-reservations-provider", func(t *testing.T) {
		golden(t, "get-reservations-provider", print(t, output.Flags{}, get.ReservationListing(provided, false)))
	})
	t.Run("get-reservations-empty", func(t *testing.T) {
		golden(t, "get-reservations-empty", print(t, output.Flags{}, get.ReservationListing(nil, false)))
	})

	t.Run("describe-reservation", func(t *testing.T) {
		events := []eventsv1.Event{
			{EventTime: metav1.NewMicroTime(goldenNow.Add(-5 * time.Minute)), ReportingController: "broker.fluidos.eu/rb-agent",
				Reason: "Reserved", Type: corev1.EventTypeNormal, Note: "paris reserved 2 CPU, 4Gi"},
			{DeprecatedLastTimestamp: metav1.NewTime(goldenNow.Add(-time.Minute)), DeprecatedCount: 3, DeprecatedSource: corev1.EventSource{Component: "rb-agent"},
				Reason: "Renewed", Type: corev1.EventTypeNormal, Note: "lease renewed"},
		}
		var out bytes.Buffer
		require.NoError(t, describe.Print(&out, goldenObject(), r, map[string]string{"paris": "EUR", "berlin": "EUR"}, events, goldenNow))
		golden(t, "describe-reservation", out.Bytes())
	})
	t.Run("describe-reservation-preempted", func(t *testing.T) {
		taken := member
		taken.Phase, taken.Priority, taken.PreemptedBy, taken.RemainingMs = "Released", 5, "milan/urgent-1", 0
		endedAt := goldenNow.Add(-time.Minute)
		taken.EndedAt = &endedAt
		var out bytes.Buffer
		require.NoError(t, describe.Print(&out, nil, taken, map[string]string{"paris": "EUR", "berlin": "EUR"}, nil, goldenNow))
		golden(t, "describe-reservation-preempted", out.Bytes())
	})
	t.Run("describe-reservation-ended", func(t *testing.T) {
		var out bytes.Buffer
		obj := &v1alpha1.Reservation{ObjectMeta: metav1.ObjectMeta{Namespace: "batch", Name: "job-1"},
			Status: v1alpha1.ReservationStatus{Phase: v1alpha1.ReservationReleased, ReservationID: "gone-uid"}}
		require.NoError(t, describe.Print(&out, obj, api.Reservation{}, nil, nil, goldenNow))
		golden(t, "describe-reservation-ended", out.Bytes())
	})

	for _, bad := range []string{"xml", "jsonpath=", "table"} {
		p := output.Flags{Output: bad}
		assert.Error(t, p.Validate(), bad)
	}
}
