package store

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/scripts"
)

// Scored is how this store's clusters would take a request (score.lua):
// its best candidates, best first, and the price range over the fitting
// clusters that normalised their cost scores (MinPrice and MaxPrice are -1
// when nothing fits).
type Scored struct {
	Candidates         []model.Candidate
	MinPrice, MaxPrice int64
}

// Score scores req as Reserve would decide it now, and decides nothing:
// no reservation, no usage, no rate, no waiting list, no event. The
// requester's preferences are the policy's when it carries none, as in
// Reserve.
func (s *Store) Score(ctx context.Context, req model.ReserveRequest) (Scored, error) {
	arg, err := encodeReserveArg(s.withLimits(req))
	if err != nil {
		return Scored{}, err
	}
	replies, err := s.run(ctx, scripts.Score, s.cfg.StaleThreshold.Milliseconds(), s.cfg.WeightResources, s.cfg.WeightCost,
		s.cfg.TopCandidates, arg)
	if err != nil {
		return Scored{}, err
	}
	reply, ok := replies[0].([]any)
	if len(replies) != 1 || !ok || len(reply) != 3 {
		return Scored{}, fmt.Errorf("unexpected score reply %v", replies)
	}
	var out Scored
	raw, _ := reply[0].(string)
	if err := json.Unmarshal([]byte(raw), &out.Candidates); err != nil {
		return Scored{}, fmt.Errorf("decode candidates: %w", err)
	}
	out.MinPrice, _ = reply[1].(int64)
	out.MaxPrice, _ = reply[2].(int64)
	return out, nil
}
