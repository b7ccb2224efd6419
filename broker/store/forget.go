package store

import (
	"context"
	"fmt"

	"github.com/fluidos-project/resource-broker/broker/scripts"
)

// BusyError refuses to forget a cluster that live reservations still name.
type BusyError struct {
	Cluster                 string
	AsRequester, AsProvider int64
}

// Is makes a BusyError an ErrConflict.
func (e *BusyError) Is(target error) bool { return target == ErrConflict }

func (e *BusyError) Error() string {
	return fmt.Sprintf("cluster %s still has live reservations (%d as requester, %d as provider): they must end first (released, or expired)",
		e.Cluster, e.AsRequester, e.AsProvider)
}

// Forget removes cluster id from the federation (forget.lua): its
// advertisement, nodes, index entries, usage and rate state. A *BusyError
// (an ErrConflict) while live reservations name it; ErrNotFound if it has no
// advertisement.
func (s *Store) Forget(ctx context.Context, id string) error {
	reply, err := s.run(ctx, scripts.Forget, id)
	if err != nil {
		return err
	}
	if len(reply) != 3 {
		return fmt.Errorf("forget %s: unexpected reply %v", id, reply)
	}
	status, _ := reply[0].(string)
	switch status {
	case "forgotten":
		return nil
	case "unknown":
		return fmt.Errorf("%w: cluster %s has no advertisement", ErrNotFound, id)
	case "busy":
		req, _ := reply[1].(int64)
		prov, _ := reply[2].(int64)
		return &BusyError{Cluster: id, AsRequester: req, AsProvider: prov}
	}
	return fmt.Errorf("forget %s: unexpected status %q", id, status)
}
