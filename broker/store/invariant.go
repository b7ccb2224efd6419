package store

import (
	"context"
	"errors"
	"fmt"
)

// CheckInvariant verifies the accounting invariant for every cluster and
// resource: the reserved counter equals the sum of the live reservations to
// that cluster, and no cluster is overbooked (reserved <= allocatable -
// allocated, i.e. free >= 0). It reads without locking, so call it when no
// writes are in flight (tests, audits of a quiet broker).
func (s *Store) CheckInvariant(ctx context.Context) error {
	clusters, err := s.Clusters(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, c := range clusters {
		live, err := s.LiveReservations(ctx, "by-target", c.ID)
		if err != nil {
			return err
		}
		var sum Resources
		for _, r := range live {
			if !r.Live() {
				errs = append(errs, fmt.Errorf("cluster %s: index holds reservation %s in phase %s", c.ID, r.ID, r.Phase))
			}
			sum = sum.Add(r.Resources)
		}
		if sum != c.Reserved {
			errs = append(errs, fmt.Errorf("cluster %s: reserved counter %+v != sum of live reservations %+v", c.ID, c.Reserved, sum))
		}
		if f := c.Free(); f.CPU < 0 || f.Memory < 0 || f.GPU < 0 || f.Storage < 0 {
			// Only an advertisement that shrank below what is reserved may do this;
			// a reservation never does.
			errs = append(errs, fmt.Errorf("cluster %s: overbooked, free %+v", c.ID, f))
		}
	}
	return errors.Join(errs...)
}

// Add returns r + o.
func (r Resources) Add(o Resources) Resources {
	return Resources{CPU: r.CPU + o.CPU, Memory: r.Memory + o.Memory, GPU: r.GPU + o.GPU, Storage: r.Storage + o.Storage}
}
