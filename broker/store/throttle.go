package store

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/scripts"
)

// Throttle counts one call of member against the rates of charges, all or
// nothing (throttle.lua), on the Redis clock so that every replica counts
// alike. Over one of them it returns a *LimitError (Limit "rate", Calls its
// kind) and counts nothing. Charges whose rate is no limit cost nothing;
// without any, Redis is not called. The rate state is not worth a WAIT for
// replicas: a failover that loses it only lets a member call a little sooner.
func (s *Store) Throttle(ctx context.Context, member string, charges ...model.Charge) error {
	args := make([]any, 0, 1+4*len(charges))
	args = append(args, member)
	for _, c := range charges {
		if c.Rate.PerSecond <= 0 {
			continue
		}
		args = append(args, c.Kind, strconv.FormatFloat(c.Rate.PerSecond, 'g', -1, 64),
			strconv.FormatInt(max(c.Rate.Burst, 1), 10), strconv.FormatInt(max(c.Cost, 1), 10))
	}
	if len(args) == 1 {
		return nil
	}
	v, err := scripts.Throttle.Run(ctx, s.rdb, []string{s.cfg.Prefix}, args...).Result()
	if err != nil {
		return err
	}
	reply, ok := v.([]any)
	if !ok {
		return fmt.Errorf("throttle: unexpected reply %T", v)
	}
	if len(reply) == 0 {
		return nil
	}
	if len(reply) != 3 {
		return fmt.Errorf("throttle: unexpected reply %v", reply)
	}
	kind, _ := reply[0].(string)
	maxRate, _ := strconv.ParseFloat(fmt.Sprint(reply[1]), 64)
	wait, _ := reply[2].(int64)
	return &LimitError{Requester: member, Limit: "rate", Calls: kind, Max: maxRate, RetryAfter: time.Duration(wait) * time.Millisecond}
}
