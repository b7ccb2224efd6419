package api_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/model"
)

var limits = api.Limits{DefaultDuration: time.Hour, MaxDuration: 24 * time.Hour}

// checkRequest is what every accepted request must satisfy before it reaches Redis.
func checkRequest(t *testing.T, r model.ReserveRequest) {
	t.Helper()
	if r.Resources.CPU <= 0 || r.Resources.Memory <= 0 || r.Resources.GPU < 0 || r.Resources.Storage < 0 {
		t.Fatalf("accepted invalid amounts %+v", r.Resources)
	}
	for _, v := range []int64{r.Resources.CPU, r.Resources.Memory, r.Resources.GPU, r.Resources.Storage} {
		if v > model.MaxAmount {
			t.Fatalf("accepted an amount the scripts cannot hold exactly: %d", v)
		}
	}
	if r.Duration <= 0 || r.Duration > limits.MaxDuration {
		t.Fatalf("accepted duration %s", r.Duration)
	}
	if err := api.ValidateReservationID(r.ID); err != nil {
		t.Fatalf("accepted id %q: %v", r.ID, err)
	}
	if r.Lease != 0 && (r.Lease < api.MinLease || r.Lease > limits.MaxDuration) {
		t.Fatalf("accepted lease %s", r.Lease)
	}
}

func FuzzReservationRequest(f *testing.F) {
	for _, s := range []string{
		`{"id":"r1","resources":{"cpu":"500m","memory":"1Gi"}}`,
		`{"id":"r1","resources":{"cpu":"2","memory":"4Gi","gpu":"1","storage":"10Gi"},"duration":"30m","selector":{"matchLabels":{"region":"eu"}},"owner":"ns/pod","priority":10}`,
		`{"id":"r1","resources":{"cpu":"1e3","memory":"1.5Gi"}}`,
		`{"id":"r1","resources":{"cpu":"-1","memory":"1Gi"}}`,
		`{"id":"r1","resources":{"cpu":"0.0001","memory":"1"}}`,
		`{"id":"r1","resources":{"cpu":"1","memory":"1Gi"},"lease":"2m","duration":"2m"}`,
		`{"id":"r1","resources":{"cpu":"1","memory":"1Gi"},"lease":"999ms"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var body api.ReservationRequest
		if api.Decode(bytes.NewReader(data), &body) != nil {
			return
		}
		r, err := body.ToStore("rome", limits)
		if err != nil {
			return
		}
		checkRequest(t, r)
	})
}

func FuzzV1ReservationRequest(f *testing.F) {
	f.Add([]byte(`{"requestedResources":{"cpu":"2","memory":"4Gi"},"priority":5,"duration":"1h"}`))
	f.Add([]byte(`{"requestedResources":{"cpu":"2","memory":"4Gi","gpu":"1"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var body api.V1ReservationRequest
		if api.Decode(bytes.NewReader(data), &body) != nil {
			return
		}
		r, err := body.ToStore("rsv-rome-1", "rome", limits)
		if err != nil {
			return
		}
		checkRequest(t, r)
	})
}

func FuzzAdvertisement(f *testing.F) {
	f.Add([]byte(`{"clusterName":"paris","endpoint":"https://paris:6443","labels":{"region":"eu"},
		"resources":{"capacity":{"cpu":"8","memory":"32Gi"},"allocatable":{"cpu":"7500m","memory":"30Gi","gpu":"2"},"allocated":{"cpu":"1","memory":"1Gi"}},
		"prices":{"currency":"EUR","cpu":"0.031","memory":"0.004","gpu":"0.9"}}`))
	f.Add([]byte(`{"resources":{"capacity":{},"allocatable":{},"allocated":{}}}`))
	f.Add([]byte(`{"resources":{"capacity":{"cpu":"8"},"allocatable":{"cpu":"8"},"allocated":{},
		"nodes":[{"name":"n1","allocatable":{"cpu":"4","memory":"8Gi","gpu":"1"},"allocated":{"cpu":"1","memory":"1Gi"}},
		{"name":"n2.zone-a","allocatable":{"cpu":"4"},"allocated":{"cpu":"4"}}],"reservationsOnNodes":["rome/r1","milan/r2"]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var body api.Advertisement
		if api.Decode(bytes.NewReader(data), &body) != nil {
			return
		}
		ad, err := body.ToStore()
		if err != nil {
			return
		}
		amounts := []model.Resources{ad.Capacity, ad.Allocatable, ad.Allocated}
		for _, n := range ad.Nodes {
			amounts = append(amounts, n.Allocatable, n.Allocated)
		}
		for _, r := range amounts {
			for _, v := range []int64{r.CPU, r.Memory, r.GPU, r.Storage} {
				if v < 0 || v > model.MaxAmount {
					t.Fatalf("accepted amount %d", v)
				}
			}
		}
		for _, p := range []int64{ad.Prices.CPU, ad.Prices.Memory, ad.Prices.GPU} {
			if p < 0 || p > model.MaxAmount {
				t.Fatalf("accepted price %+v", ad.Prices)
			}
		}
		if len(ad.Nodes) > api.MaxNodes || len(ad.ReservationsOnNodes) > api.MaxReservationsOnNodes {
			t.Fatalf("accepted %d nodes, %d ids", len(ad.Nodes), len(ad.ReservationsOnNodes))
		}
		names := map[string]bool{}
		for _, n := range ad.Nodes {
			if names[n.Name] || strings.ContainsAny(n.Name, " \t\n") || n.Name == "" {
				t.Fatalf("accepted node name %q", n.Name)
			}
			names[n.Name] = true
			a, u := n.Allocatable, n.Allocated
			for i, v := range []int64{u.CPU, u.Memory, u.GPU, u.Storage} {
				if v < 0 || v > []int64{a.CPU, a.Memory, a.GPU, a.Storage}[i] {
					t.Fatalf("accepted node %+v", n)
				}
			}
		}
		for _, id := range ad.ReservationsOnNodes {
			if api.ValidateQualifiedReservationID(id) != nil {
				t.Fatalf("accepted id %q", id)
			}
		}
	})
}

func FuzzV1Advertisement(f *testing.F) {
	f.Add([]byte(`{"clusterID":"paris","clusterName":"paris","resources":{"capacity":{"cpu":"8","memory":"32Gi"},
		"allocatable":{"cpu":"8","memory":"32Gi"},"allocated":{"cpu":"500m","memory":"1Gi"},"available":{"cpu":"7","memory":"31Gi"}},
		"timestamp":"2026-11-22T10:00:00Z"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var body api.V1Advertisement
		if api.Decode(bytes.NewReader(data), &body) != nil {
			return
		}
		ad, err := body.ToStore()
		if err != nil {
			return
		}
		if ad.Allocatable.CPU < 0 || ad.Allocated.Memory < 0 {
			t.Fatalf("accepted negative amounts %+v", ad)
		}
	})
}

// FuzzRenewRequest: every renewal the decoder and Validate accept carries at
// most api.MaxRenewBatch ids, each a valid reservation id.
func FuzzRenewRequest(f *testing.F) {
	for _, s := range []string{
		`{"ids":["a","b-1","pod.x"]}`,
		`{"ids":[]}`,
		`{"ids":["Not_An_Id"]}`,
		`{"ids":[""]}`,
		`{"ids":"a"}`,
		`{"ids":["a"],"x":1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var body api.RenewRequest
		if api.Decode(bytes.NewReader(data), &body) != nil || body.Validate() != nil {
			return
		}
		if len(body.IDs) > api.MaxRenewBatch {
			t.Fatalf("accepted %d ids", len(body.IDs))
		}
		for _, id := range body.IDs {
			if err := api.ValidateReservationID(id); err != nil {
				t.Fatalf("accepted id %q: %v", id, err)
			}
		}
	})
}
