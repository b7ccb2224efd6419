package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/scripts"
)

// Advertise stores a cluster's advertisement and marks it live. An
// advertisement that contradicts itself is refused (ErrInvalid), one outside
// the operator's bounds too (*BoundError): nothing is stored.
func (s *Store) Advertise(ctx context.Context, id string, ad model.Advertisement) (model.Ack, error) {
	if err := ad.Validate(); err != nil {
		return model.Ack{}, err
	}
	if s.cfg.Policy != nil {
		if err := s.cfg.Policy.CheckAdvertisement(id, ad); err != nil {
			return model.Ack{}, err
		}
	}
	labels := "{}"
	if len(ad.Labels) > 0 {
		b, err := json.Marshal(ad.Labels)
		if err != nil {
			return model.Ack{}, err
		}
		labels = string(b)
	}
	args := make([]any, 0, 40+9*len(ad.Nodes)+len(ad.ReservationsOnNodes))
	args = append(args, id, s.cfg.EventsMaxLen, s.cfg.EventsTTL.Milliseconds(), "", len(ad.Nodes))
	const digestArg, contentArgs = 3, 4 // the digest's place, and where what it digests begins
	for _, n := range ad.Nodes {
		a, u := n.Allocatable, n.Allocated
		args = append(args, n.Name, a.CPU, a.Memory, a.GPU, a.Storage, u.CPU, u.Memory, u.GPU, u.Storage)
	}
	args = append(args, len(ad.ReservationsOnNodes))
	for _, rid := range ad.ReservationsOnNodes {
		args = append(args, rid)
	}
	args = append(args,
		"name", ad.Name, "endpoint", ad.Endpoint, "labels", labels,
		"price_cpu", ad.Prices.CPU, "price_mem", ad.Prices.Memory, "price_gpu", ad.Prices.GPU,
		"currency", ad.Prices.Currency,
	)
	args = appendResources(args, "cap_", ad.Capacity)
	args = appendResources(args, "alloc_", ad.Allocatable)
	args = appendResources(args, "used_", ad.Allocated)
	digest := digestOf(args[contentArgs:])
	args[digestArg] = digest
	reply, err := s.run(ctx, scripts.Advertise, args...)
	if err != nil {
		return model.Ack{}, err
	}
	f := toStrings(reply[:5])
	debits, _ := reply[5].([]any)
	nodes := withNodes(model.Cluster{}, nil, flatMap(toStrings(debits)))
	return model.Ack{
		SeenAt:        msTime(atoi(f[0])),
		Reserved:      model.Resources{CPU: atoi(f[1]), Memory: atoi(f[2]), GPU: atoi(f[3]), Storage: atoi(f[4])},
		NodesReserved: nodes.NodesReserved,
		Digest:        digest,
	}, nil
}

// digestOf names an advertisement by its script arguments: the same
// advertisement gets the same digest on every replica, and a changed one
// another (64 bits of SHA-256: a collision between two successive
// advertisements of one cluster is out of reach).
func digestOf(args []any) string {
	h := sha256.New()
	for _, a := range args {
		fmt.Fprint(h, a)
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:model.DigestLength]
}

// ErrAdvertisementNeeded answers a heartbeat whose cluster must advertise
// in full: the broker does not hold the advertisement it names, or the
// cluster is no candidate any more (stale).
var ErrAdvertisementNeeded = errors.New("the broker does not hold the advertisement this heartbeat names, or the cluster went stale: advertise in full")

// Heartbeat refreshes the liveness of cluster id, whose advertisement is
// still the one stored under digest (heartbeat.lua), and answers as
// Advertise does but for the node debits. ErrAdvertisementNeeded: nothing
// was written, the cluster must advertise in full.
func (s *Store) Heartbeat(ctx context.Context, id, digest string) (model.Ack, error) {
	reply, err := s.run(ctx, scripts.Heartbeat, id, digest)
	if err != nil {
		return model.Ack{}, err
	}
	if len(reply) == 0 {
		return model.Ack{}, ErrAdvertisementNeeded
	}
	f := toStrings(reply)
	figures := func(at int) model.Resources {
		return model.Resources{CPU: atoi(f[at]), Memory: atoi(f[at+1]), GPU: atoi(f[at+2]), Storage: atoi(f[at+3])}
	}
	return model.Ack{
		SeenAt:      msTime(atoi(f[0])),
		Reserved:    figures(1),
		Allocatable: figures(5),
		Allocated:   figures(9),
		Digest:      digest,
	}, nil
}

func appendResources(args []any, prefix string, r model.Resources) []any {
	return append(args, prefix+"cpu", r.CPU, prefix+"mem", r.Memory, prefix+"gpu", r.GPU, prefix+"sto", r.Storage)
}
