package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/fluidos-project/resource-broker/broker/model"
)

// DefaultCell is the cell of a broker that is not split: its prefix is
// DefaultPrefix.
const DefaultCell = "b"

// CellPrefix is the key prefix of a cell: its name is the hash tag, so that
// every key of the cell lands in one Redis Cluster slot, and the cells of a
// federation spread over the primaries of a Redis Cluster.
func CellPrefix(cell string) string { return "rb:{" + cell + "}:" }

// CellRule maps a member cluster to its cell.
type CellRule struct {
	// Label is the cluster label whose value names a cluster's cell (e.g.
	// "region"); "": every cluster is in Default.
	Label string
	// Default is the cell of a cluster without the label, or whose value
	// names no cell; default DefaultCell.
	Default string
}

// Cells is a federation split into cells: each cell is a complete broker
// state (clusters, reservations, waiting list, usage, events, audit) under
// its own prefix, CellPrefix(name), one Store each over one client (a
// redis.ClusterClient sends each cell's scripts to the primary that holds
// its slot). Nothing is global: a script touches one cell, so no call spans
// two slots. A requester's limits hold across the cells all the same: a
// decision in one cell is given the policy's limits less what the requester
// holds in the others (Reserve, ReserveGroup, ReserveAcross), read just
// before; two decisions of one requester in flight in two cells at once may
// together go past them by what the other one asked.
type Cells struct {
	rule   CellRule
	names  []string
	stores map[string]*Store
}

// NewCells returns the stores of the named cells over rdb, each with cfg
// and its own prefix (cfg.Prefix must be empty). No names: one cell,
// rule.Default, which with the default rule is DefaultCell, the unsplit
// broker's keys.
func NewCells(rdb redis.UniversalClient, cfg Config, names []string, rule CellRule) (*Cells, error) {
	if cfg.Prefix != "" {
		return nil, fmt.Errorf("cells: Config.Prefix %q: each cell has its own prefix", cfg.Prefix)
	}
	if rule.Default == "" {
		rule.Default = DefaultCell
	}
	if len(names) == 0 {
		names = []string{rule.Default}
	}
	c := &Cells{rule: rule, stores: make(map[string]*Store, len(names))}
	for _, n := range names {
		if n == "" || strings.ContainsAny(n, "{}") {
			return nil, fmt.Errorf("cells: cell name %q: it must be non-empty, without braces (it is the hash tag)", n)
		}
		if c.stores[n] != nil {
			return nil, fmt.Errorf("cells: cell %q named twice", n)
		}
		cellCfg := cfg
		cellCfg.Prefix = CellPrefix(n)
		c.stores[n] = New(rdb, cellCfg)
		c.names = append(c.names, n)
	}
	if c.stores[rule.Default] == nil {
		return nil, fmt.Errorf("cells: the default cell %q is not one of %v", rule.Default, names)
	}
	slices.Sort(c.names)
	return c, nil
}

// Names lists the cells, sorted.
func (c *Cells) Names() []string { return slices.Clone(c.names) }

// Default is the cell of a cluster that no label places (CellRule.Default).
func (c *Cells) Default() string { return c.rule.Default }

// Cell returns the store of a cell, nil if there is none of that name.
func (c *Cells) Cell(name string) *Store { return c.stores[name] }

// CellOf is the cell of a cluster with these labels.
func (c *Cells) CellOf(labels map[string]string) string {
	if v, ok := labels[c.rule.Label]; ok && c.rule.Label != "" && c.stores[v] != nil {
		return v
	}
	return c.rule.Default
}

// LoadScripts loads the scripts (on every primary) and builds each cell's
// candidate index if missing.
func (c *Cells) LoadScripts(ctx context.Context) error {
	for _, n := range c.names {
		if err := c.stores[n].LoadScripts(ctx); err != nil {
			return fmt.Errorf("cell %s: %w", n, err)
		}
	}
	return nil
}

// Advertise stores a cluster's advertisement in its cell (CellOf its
// labels). A cluster whose label moves it to another cell goes stale in
// the old one; its live reservations there stay there until they end.
func (c *Cells) Advertise(ctx context.Context, id string, ad model.Advertisement) (model.Ack, string, error) {
	cell := c.CellOf(ad.Labels)
	ack, err := c.stores[cell].Advertise(ctx, id, ad)
	return ack, cell, err
}

// Find returns the cell that holds requester's reservation id (live or
// ended within the retention), or ErrNotFound.
func (c *Cells) Find(ctx context.Context, requester, id string) (string, error) {
	found := make([]bool, len(c.names))
	var g errgroup.Group
	for i, n := range c.names {
		st := c.stores[n]
		g.Go(func() error {
			k, err := st.rdb.Exists(ctx, st.Key("resv:", model.QualifiedID(requester, id))).Result()
			found[i] = k > 0
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return "", err
	}
	if i := slices.Index(found, true); i >= 0 {
		return c.names[i], nil
	}
	return "", ErrNotFound
}

// Release ends requester's reservation id in the cell that holds it.
func (c *Cells) Release(ctx context.Context, requester, id, caller string) (ReleaseResult, error) {
	cell, err := c.Find(ctx, requester, id)
	if err != nil {
		return ReleaseResult{}, err
	}
	return c.stores[cell].Release(ctx, requester, id, caller)
}

// CellScored is one cell's answer to a scoring pass.
type CellScored struct {
	Cell string
	Scored
}

// Score scores req in each of the named cells at once (score.lua: nothing
// is decided), in the order given.
func (c *Cells) Score(ctx context.Context, cells []string, req model.ReserveRequest) ([]CellScored, error) {
	out := make([]CellScored, len(cells))
	g, gctx := errgroup.WithContext(ctx)
	for i, n := range cells {
		st := c.stores[n]
		if st == nil {
			return nil, fmt.Errorf("cells: no cell %q", n)
		}
		g.Go(func() error {
			sc, err := st.Score(gctx, req)
			out[i] = CellScored{Cell: n, Scored: sc}
			return err
		})
	}
	return out, g.Wait()
}

// CellCandidate is a candidate of one cell, scored against every cell
// scored with it.
type CellCandidate struct {
	Cell string
	model.Candidate
}

// Rank merges the cells' candidates into one order, best first, as one
// decision over all their clusters would score them: the resource score is
// the same in every cell; the cost score is rescaled to the price range
// over all the cells (the union of theirs). Ties go to the smallest cluster
// id, as in reserve.lua. Only each cell's reported candidates take part
// (Config.TopCandidates): a cell's best by the union's cost scale can be
// one it did not report only when the weights favour cost and its prices
// straddle another cell's.
func Rank(scored []CellScored, wRes, wCost float64) []CellCandidate {
	lo, hi := int64(-1), int64(-1)
	for _, s := range scored {
		if len(s.Candidates) == 0 {
			continue
		}
		if lo < 0 || s.MinPrice < lo {
			lo = s.MinPrice
		}
		if s.MaxPrice > hi {
			hi = s.MaxPrice
		}
	}
	var out []CellCandidate
	for _, s := range scored {
		for _, cand := range s.Candidates {
			cand.CostScore = 100
			if hi > lo {
				cand.CostScore = 100 * float64(hi-cand.Price) / float64(hi-lo)
			}
			cand.Score = wRes*cand.ResourceScore + wCost*cand.CostScore
			out = append(out, CellCandidate{Cell: s.Cell, Candidate: cand})
		}
	}
	slices.SortStableFunc(out, func(a, b CellCandidate) int {
		if a.Score != b.Score {
			if a.Score > b.Score {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Cluster, b.Cluster)
	})
	return out
}

// CellDecision is a decision and the cell that made it.
type CellDecision struct {
	Cell string
	model.Decision
}

// Reserve decides req in cell, within its requester's limits less what it
// holds in the other cells.
func (c *Cells) Reserve(ctx context.Context, cell string, req model.ReserveRequest) (model.Decision, error) {
	st := c.stores[cell]
	if st == nil {
		return model.Decision{}, fmt.Errorf("cells: no cell %q", cell)
	}
	held, err := c.heldElsewhere(ctx, req.Requester, cell)
	if err != nil {
		return model.Decision{}, err
	}
	req.HeldElsewhere = held
	d, err := st.Reserve(ctx, req)
	return d, federationWide(err, held)
}

// ReserveGroup decides req in cell, as Reserve does.
func (c *Cells) ReserveGroup(ctx context.Context, cell string, req model.GroupRequest) (model.GroupDecision, error) {
	st := c.stores[cell]
	if st == nil {
		return model.GroupDecision{}, fmt.Errorf("cells: no cell %q", cell)
	}
	held, err := c.heldElsewhere(ctx, req.Requester, cell)
	if err != nil {
		return model.GroupDecision{}, err
	}
	req.HeldElsewhere = held
	d, err := st.ReserveGroup(ctx, req)
	return d, federationWide(err, held)
}

// heldElsewhere sums what requester holds in every cell but cell (one
// read of each cell's usage field); nothing is read without a policy.
func (c *Cells) heldElsewhere(ctx context.Context, requester, cell string) (model.Usage, error) {
	var held model.Usage
	if len(c.names) == 1 || c.stores[cell].cfg.Policy == nil {
		return held, nil
	}
	cmds := map[string]*redis.StringCmd{}
	pipe := c.stores[cell].rdb.Pipeline()
	for _, n := range c.names {
		if n != cell {
			cmds[n] = pipe.HGet(ctx, c.stores[n].Key("usage"), requester)
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return held, fmt.Errorf("cells: usage of %s in the other cells: %w", requester, err)
	}
	for _, cmd := range cmds {
		if v, err := cmd.Result(); err == nil {
			a := amountsOf(v)
			held.Reservations += atoi(a["n"])
			held.Resources = held.Resources.Add(resourcesFrom(a, ""))
		}
	}
	return held, nil
}

// federationWide restates a refusal by a limit (its cell's script saw the
// limit less held, against the cell's usage) as the whole federation's:
// the limit and what the requester holds in every cell.
func federationWide(err error, held model.Usage) error {
	var le *LimitError
	if !errors.As(err, &le) {
		return err
	}
	add := map[string]int64{"reservations": held.Reservations, "cpu": held.Resources.CPU, "memory": held.Resources.Memory, "gpu": held.Resources.GPU}[le.Limit]
	le.Max += float64(add)
	le.Used += add
	return err
}

// MemberUsages is Store.MemberUsages over the whole federation: each
// member's live and ended reservations summed over every cell.
func (c *Cells) MemberUsages(ctx context.Context) ([]MemberUsage, error) {
	byID := map[string]*MemberUsage{}
	var ids []string
	for _, n := range c.names {
		ms, err := c.stores[n].MemberUsages(ctx)
		if err != nil {
			return nil, fmt.Errorf("cell %s: %w", n, err)
		}
		for _, m := range ms {
			sum := byID[m.Cluster]
			if sum == nil {
				sum = &MemberUsage{Cluster: m.Cluster, Limits: m.Limits}
				byID[m.Cluster] = sum
				ids = append(ids, m.Cluster)
			}
			sum.Usage.Reservations += m.Usage.Reservations
			sum.Usage.Resources = sum.Usage.Resources.Add(m.Usage.Resources)
			sum.Ended += m.Ended
		}
	}
	slices.Sort(ids)
	out := make([]MemberUsage, 0, len(ids))
	for _, id := range ids {
		out = append(out, *byID[id])
	}
	return out, nil
}

// ReserveAcross asks every cell for req, whose requester's cell is home,
// and reserves in the cell of the best candidate over all of them:
//  1. an id already decided in some cell is decided there again (a replay,
//     or a conflict), never a second time elsewhere;
//  2. a read-only scoring pass in every cell at once (Score), merged by Rank;
//  3. a reserve, without waiting, in the best cell, which decides with its
//     whole gate (rate, limits, priority) on its state then: the scoring
//     holds no capacity, so another request may have taken it meanwhile,
//     and a refusal there moves on to the next cell in the ranking;
//  4. nothing taken: a reserve in the home cell as req asks (it waits there).
//
// So no capacity is ever held in two cells, nothing has to be given back,
// and the cost of asking several cells is one scoring call per cell (in
// parallel) and a reserve per cell tried. Two concurrent first calls of
// one id may still land in two cells (1 and 3 are not one atomic step): an
// agent retries an id only after the answer of the previous call.
// Requests with a spread go to the home cell only (Reserve).
func (c *Cells) ReserveAcross(ctx context.Context, home string, req model.ReserveRequest) (CellDecision, error) {
	homeStore := c.stores[home]
	if homeStore == nil {
		return CellDecision{}, fmt.Errorf("cells: no cell %q", home)
	}
	if req.Spread != nil || len(c.names) == 1 {
		d, err := c.Reserve(ctx, home, req)
		return CellDecision{Cell: home, Decision: d}, err
	}
	if cell, err := c.Find(ctx, req.Requester, req.ID); err == nil {
		d, err := c.Reserve(ctx, cell, req)
		return CellDecision{Cell: cell, Decision: d}, err
	} else if !errors.Is(err, ErrNotFound) {
		return CellDecision{}, err
	}
	scored, err := c.Score(ctx, c.names, req)
	if err != nil {
		return CellDecision{}, err
	}
	cfg := homeStore.Config()
	tried := map[string]bool{}
	for _, cand := range Rank(scored, cfg.WeightResources, cfg.WeightCost) {
		if tried[cand.Cell] {
			continue
		}
		tried[cand.Cell] = true
		once := req
		once.NoWait = true
		d, err := c.Reserve(ctx, cand.Cell, once)
		var nf *NoFitError
		if errors.As(err, &nf) {
			continue // taken meanwhile: the next cell
		}
		return CellDecision{Cell: cand.Cell, Decision: d}, err
	}
	d, err := c.Reserve(ctx, home, req)
	return CellDecision{Cell: home, Decision: d}, err
}

// ExpireRun runs the expiry of every cell.
func (c *Cells) ExpireRun(ctx context.Context) (map[string]ExpireResult, error) {
	out := make(map[string]ExpireResult, len(c.names))
	for _, n := range c.names {
		r, err := c.stores[n].ExpireRun(ctx)
		if err != nil {
			return out, fmt.Errorf("cell %s: %w", n, err)
		}
		out[n] = r
	}
	return out, nil
}

// CheckInvariant checks the invariant of every cell.
func (c *Cells) CheckInvariant(ctx context.Context) error {
	var errs []error
	for _, n := range c.names {
		if err := c.stores[n].CheckInvariant(ctx); err != nil {
			errs = append(errs, fmt.Errorf("cell %s: %w", n, err))
		}
	}
	return errors.Join(errs...)
}
