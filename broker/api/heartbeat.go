package api

import (
	"time"

	"github.com/fluidos-project/resource-broker/broker/model"
)

// ReasonAdvertisementNeeded (409) answers a heartbeat the broker cannot take:
// it does not hold the advertisement the heartbeat names (never stored, a
// newer one stored since, its state lost) or the cluster went stale. Nothing
// was written: send the full advertisement now.
const ReasonAdvertisementNeeded = "AdvertisementNeeded"

// HeartbeatRequest is the body of PUT /api/v2/clusters/{id}/heartbeat: the
// cluster's advertisement is still the one stored under Digest (Cluster.Digest,
// as the broker answered the advertisement).
type HeartbeatRequest struct {
	Digest string `json:"digest"`
}

// Validate checks the digest's shape: the broker's own, DigestLength
// lowercase hex digits.
func (h HeartbeatRequest) Validate() error {
	if len(h.Digest) != model.DigestLength {
		return invalid("digest: %d characters, want the %d hex digits the broker answered the advertisement with", len(h.Digest), model.DigestLength)
	}
	for _, c := range h.Digest {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return invalid("digest %q: want lowercase hex digits, as the broker answered the advertisement", h.Digest)
		}
	}
	return nil
}

// Heartbeat is the answer to a heartbeat: the cluster's liveness refreshed,
// with what the broker reserves on it and what remains available of the
// figures it holds (the advertisement the digest names).
type Heartbeat struct {
	ClusterID string     `json:"clusterID"`
	Digest    string     `json:"digest"`
	SeenAt    time.Time  `json:"seenAt"`
	Reserved  Quantities `json:"reserved"`
	Available Quantities `json:"available"`
}

// HeartbeatFromStore renders the store's answer to a heartbeat.
func HeartbeatFromStore(id string, ack model.Ack) Heartbeat {
	c := model.Cluster{Advertisement: model.Advertisement{Allocatable: ack.Allocatable, Allocated: ack.Allocated}, Reserved: ack.Reserved}
	return Heartbeat{ClusterID: id, Digest: ack.Digest, SeenAt: ack.SeenAt, Reserved: FromResources(ack.Reserved), Available: FromResources(c.Free())}
}
