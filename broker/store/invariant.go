package store

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/redis/go-redis/v9"
)

// CheckInvariant verifies the accounting invariant for every cluster and
// resource: the reserved counter equals the sum of the live reservations to
// that cluster, and no cluster is overbooked (reserved <= allocatable -
// allocated, i.e. free >= 0). For every node, the broker's debit equals the
// sum of the live reservations placed there that the cluster's last
// advertisement did not list, and no node is overbooked by the broker (for
// each resource it debits, debit <= the node's advertised free).
//
// It reads key after key without locking, while every script writes its
// keys atomically: a write between two reads (an agent's advertisement
// rewriting a cluster's hash and its index entries) can make a single
// reading disagree with itself. So a disagreement counts only when it
// persists over several readings; one clean reading is the invariant
// holding at that moment.
func (s *Store) CheckInvariant(ctx context.Context) error {
	var err error
	for attempt := range invariantReadings {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return err
			case <-time.After(100 * time.Millisecond):
			}
		}
		if err = s.checkInvariantOnce(ctx); err == nil {
			return nil
		}
	}
	return err
}

// overbooked tells whether a negative free amount is the broker's doing.
// Only an advertisement that shrank below what is reserved may leave one
// (advertise.lua marks the resource short, with the amount then reserved);
// a reservation never does, so one that grew the reserved amount since is.
func overbooked(free, reserved, short int64) bool {
	return free < 0 && (short == 0 || reserved > short)
}

// invariantReadings is how many readings CheckInvariant takes before it
// reports a disagreement.
const invariantReadings = 5

func (s *Store) checkInvariantOnce(ctx context.Context) error {
	clusters, err := s.Clusters(ctx)
	if err != nil {
		return err
	}
	var errs []error
	var allLive []model.Reservation
	for _, c := range clusters {
		live, err := s.LiveReservations(ctx, "by-target", c.ID)
		if err != nil {
			return err
		}
		allLive = append(allLive, live...)
		var sum model.Resources
		for _, r := range live {
			if !r.Live() {
				errs = append(errs, fmt.Errorf("cluster %s: index holds reservation %s in phase %s", c.ID, r.ID, r.Phase))
			}
			sum = sum.Add(r.Resources)
		}
		if sum != c.Reserved {
			errs = append(errs, fmt.Errorf("cluster %s: reserved counter %+v != sum of live reservations %+v", c.ID, c.Reserved, sum))
		}
		if f := c.Free(); overbooked(f.CPU, c.Reserved.CPU, c.Short.CPU) || overbooked(f.Memory, c.Reserved.Memory, c.Short.Memory) ||
			overbooked(f.GPU, c.Reserved.GPU, c.Short.GPU) || overbooked(f.Storage, c.Reserved.Storage, c.Short.Storage) {
			errs = append(errs, fmt.Errorf("cluster %s: overbooked, free %+v (allocatable %+v, allocated %+v, reserved %+v, %d nodes advertised)",
				c.ID, f, c.Allocatable, c.Allocated, c.Reserved, len(c.Nodes)))
		}
		nodeErrs, err := s.checkNodes(ctx, c, live)
		if err != nil {
			return err
		}
		errs = append(errs, nodeErrs...)
	}
	if err := s.checkIndex(ctx, clusters); err != nil { // errors say "index: ..."

		errs = append(errs, err)
	}
	spreadErrs, err := s.checkSpread(ctx, allLive)
	if err != nil {
		return err
	}
	errs = append(errs, spreadErrs...)
	usageErrs, err := s.checkUsage(ctx)
	if err != nil {
		return err
	}
	errs = append(errs, usageErrs...)
	endedErrs, err := s.checkEnded(ctx)
	if err != nil {
		return err
	}
	errs = append(errs, endedErrs...)
	live, err := s.rdb.ZRange(ctx, s.Key("expiry"), 0, -1).Result()
	if err != nil {
		return err
	}
	grantErrs, err := s.checkGrants(ctx, live)
	if err != nil {
		return err
	}
	errs = append(errs, grantErrs...)
	leaseErrs, err := s.checkLeases(ctx, live)
	if err != nil {
		return err
	}
	errs = append(errs, leaseErrs...)
	parkedErrs, err := s.checkParked(ctx)
	if err != nil {
		return err
	}
	errs = append(errs, parkedErrs...)
	return errors.Join(errs...)
}

// checkParked verifies the parked leases (score +inf in expiry:
// scripts/expire.lua): each is covered by its requester's committed renewal
// set, whose entry in set-ends comes no later than the lease's end under it
// (so that expire.lua writes its end back in time), and every set-ends entry
// has its set. A requester's set and set-ends entry are read before and
// after its leases, and judged only when they stayed the same (renewals run
// while the simulator checks).
func (s *Store) checkParked(ctx context.Context) ([]error, error) {
	parked, err := s.rdb.ZRangeByScore(ctx, s.Key("expiry"), &redis.ZRangeBy{Min: "+inf", Max: "+inf"}).Result()
	if err != nil {
		return nil, err
	}
	byRequester := map[string][]string{}
	for _, qid := range parked {
		requester, _, _ := model.SplitQualifiedID(qid)
		byRequester[requester] = append(byRequester[requester], qid)
	}
	var errs []error
	for requester, qids := range byRequester {
		readSet := func() ([]any, error) {
			pipe := s.rdb.Pipeline()
			set := pipe.HMGet(ctx, s.Key("renewal:", requester), "gen", "at_ms", "lease_ms")
			end := pipe.ZScore(ctx, s.Key("set-ends"), requester)
			if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
				return nil, err
			}
			return append(set.Val(), end.Val(), end.Err() == nil), nil
		}
		for try := 0; ; try++ {
			before, err := readSet()
			if err != nil {
				return nil, err
			}
			entries, err := s.rdb.HMGet(ctx, s.Key("leases:", requester), qids...).Result()
			if err != nil {
				return nil, err
			}
			scores, err := s.rdb.ZMScore(ctx, s.Key("expiry"), qids...).Result()
			if err != nil {
				return nil, err
			}
			after, err := readSet()
			if err != nil {
				return nil, err
			}
			if !slices.Equal(before, after) && try < 4 {
				continue
			}
			gen, _ := after[0].(string)
			at, _ := strconv.ParseInt(fmt.Sprint(after[1]), 10, 64)
			setEnd, hasEnd := int64(after[3].(float64)), after[4].(bool)
			for i, qid := range qids {
				if !math.IsInf(scores[i], 1) {
					continue // its end written back since
				}
				entry, _ := entries[i].(string)
				fields := strings.Fields(entry)
				var lease int64
				if len(fields) > 0 {
					lease, _ = strconv.ParseInt(fields[0], 10, 64)
				}
				switch {
				case len(fields) != 3 || gen == "" || fields[2] != gen:
					errs = append(errs, fmt.Errorf("requester %s: lease %s parked, but its entry %q is not of its renewal set (generation %q)", requester, qid, entry, gen))
				case !hasEnd || setEnd > at+lease:
					errs = append(errs, fmt.Errorf("requester %s: lease %s parked until %d, but set-ends has %v (present: %v)", requester, qid, at+lease, setEnd, hasEnd))
				}
			}
			break
		}
	}
	ends, err := s.rdb.ZRange(ctx, s.Key("set-ends"), 0, -1).Result()
	if err != nil {
		return nil, err
	}
	for _, requester := range ends {
		pipe := s.rdb.Pipeline()
		set := pipe.Exists(ctx, s.Key("renewal:", requester))
		end := pipe.ZScore(ctx, s.Key("set-ends"), requester)
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return nil, err
		}
		if end.Err() == nil && set.Val() == 0 {
			errs = append(errs, fmt.Errorf("requester %s: set-ends entry %v without a renewal set", requester, end.Val()))
		}
	}
	return errs, nil
}

// recordFields reads fields of the record of each of qids, in pipelines
// of recordsPerPipeline: "" for a field or a record that is not there.
func (s *Store) recordFields(ctx context.Context, qids []string, fields ...string) ([][]string, error) {
	out := make([][]string, 0, len(qids))
	for chunk := range slices.Chunk(qids, recordsPerPipeline) {
		pipe := s.rdb.Pipeline()
		cmds := make([]*redis.SliceCmd, len(chunk))
		for i, qid := range chunk {
			cmds[i] = pipe.HMGet(ctx, s.Key("resv:", qid), fields...)
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return nil, err
		}
		for _, cmd := range cmds {
			row := make([]string, len(fields))
			for j, v := range cmd.Val() {
				row[j], _ = v.(string)
			}
			out = append(out, row)
		}
	}
	return out, nil
}

// recordsPerPipeline bounds a pipeline of CheckInvariant: a million reads in
// one was written to Redis slower than the client's write timeout.
const recordsPerPipeline = 10_000

// checkGrants verifies the pairs' accesses (scripts/lib/grants.lua): the
// key of every pair a live reservation or an ended one kept names holds an
// access and counts in n exactly the live records holding a share of it
// (their grant_gen is its gen), and a key no live reservation holds a share
// of is gone. A share of a key that is gone is no error: the key expires past
// its access' expiry (a dead token), whatever its count. (The broker's Redis
// user may not SCAN: a key of a pair named by no reservation kept is not
// looked for.)
func (s *Store) checkGrants(ctx context.Context, live []string) ([]error, error) {
	qids := slices.Clone(live)
	requesters, err := s.rdb.ZRange(ctx, s.Key("ended-requesters"), 0, -1).Result()
	if err != nil {
		return nil, err
	}
	for _, requester := range requesters {
		ended, err := s.rdb.ZRange(ctx, s.Key("ended:", requester), 0, -1).Result()
		if err != nil {
			return nil, err
		}
		qids = append(qids, ended...)
	}
	records, err := s.recordFields(ctx, qids, "phase", "target", "requester", "grant_gen")
	if err != nil {
		return nil, err
	}
	shares := map[string]map[string]int64{} // pair key -> gen -> live records holding a share of it
	for _, v := range records {
		phase, target, requester, gen := v[0], v[1], v[2], v[3]
		if target == "" {
			continue // gone
		}
		k := s.grantKey(target, requester)
		if shares[k] == nil {
			shares[k] = map[string]int64{}
		}
		if gen != "" && (model.Reservation{Phase: phase}).Live() {
			shares[k][gen]++
		}
	}
	pipe := s.rdb.Pipeline()
	held := map[string]*redis.SliceCmd{}
	for k := range shares {
		held[k] = pipe.HMGet(ctx, k, "n", "gen", "sealed")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	var errs []error
	for k, byGen := range shares {
		v := held[k].Val()
		n, _ := v[0].(string)
		gen, _ := v[1].(string)
		sealed, _ := v[2].(string)
		if n == "" && gen == "" && sealed == "" {
			continue // no key
		}
		if sealed == "" {
			errs = append(errs, fmt.Errorf("access %s: holds no sealed access", k))
		}
		if atoi(n) != byGen[gen] {
			errs = append(errs, fmt.Errorf("access %s: counts %s shares, %d live reservations hold one", k, n, byGen[gen]))
		}
	}
	return errs, nil
}

// checkLeases verifies the requesters' leases hashes (scripts/lib/core.lua),
// what renewals read instead of the records: every live lease has an entry
// in its requester's, holding its lease and its record's end, and every
// entry is such a lease's; no entry names a renewal set generation the
// requester has not opened, a committed set's digest is its leases', and no
// renewal set outlives the last lease.
func (s *Store) checkLeases(ctx context.Context, live []string) ([]error, error) {
	records, err := s.recordFields(ctx, live, "requester", "phase", "lease_ms", "expires_ms")
	if err != nil {
		return nil, err
	}
	want := map[string]map[string]string{} // requester -> qid -> entry
	for i, qid := range live {
		requester, phase, lease, end := records[i][0], records[i][1], records[i][2], records[i][3]
		if requester == "" || !(model.Reservation{Phase: phase}).Live() || lease == "" || lease == "0" {
			continue
		}
		if want[requester] == nil {
			want[requester] = map[string]string{}
		}
		want[requester][qid] = lease + " " + end
	}
	// Every requester that may hold a leases hash: the clusters, the
	// requesters with usage and those with live leases (the broker's user
	// may not SCAN).
	requesters := maps.Clone(want)
	clusters, err := s.rdb.ZRange(ctx, s.Key("clusters"), 0, -1).Result()
	if err != nil {
		return nil, err
	}
	usage, err := s.Usage(ctx)
	if err != nil {
		return nil, err
	}
	for _, id := range slices.Concat(clusters, slices.Collect(maps.Keys(usage))) {
		if _, ok := requesters[id]; !ok {
			requesters[id] = nil
		}
	}
	var errs []error
	for requester := range requesters {
		got, set, err := s.leasesAndSet(ctx, requester)
		if err != nil {
			return nil, err
		}
		if len(got) == 0 && set[0] != nil {
			errs = append(errs, fmt.Errorf("requester %s: a renewal set and no lease", requester))
		}
		genField, _ := set[0].(string)
		gen, _ := strconv.ParseInt(genField, 10, 64)
		var members []string // the ids of the entries of the set's generation
		for qid, entry := range got {
			// "<lease_ms> <record's expires_ms>[ <renewal set generation>]"
			fields := strings.Fields(entry)
			if len(fields) == 3 && fields[2] == genField {
				members = append(members, strings.TrimPrefix(qid, requester+"/"))
			}
			if w, ok := want[requester][qid]; !ok || len(fields) < 2 || len(fields) > 3 || fields[0]+" "+fields[1] != w {
				// The records were read before: a renewal since moved both.
				if err := s.checkLeaseEntry(ctx, requester, qid); err != nil {
					errs = append(errs, err)
				}
			} else if g, _ := strconv.ParseInt(fields[len(fields)-1], 10, 64); len(fields) == 3 && g > gen {
				errs = append(errs, fmt.Errorf("requester %s: leases entry %s = %q is of a renewal set newer than %d", requester, qid, entry, gen))
			}
		}
		// A committed set's digest names its members, as leases join and
		// leave it (scripts/lib/reservations.lua note_lease, drop_lease).
		if digest, ok := set[2].(string); ok && set[1] == nil && strings.Contains(digest, ":") && digest != renewalDigest(members) {
			errs = append(errs, fmt.Errorf("requester %s: renewal set digest %s, its %d leases' %s", requester, digest, len(members), renewalDigest(members)))
		}
		for qid := range want[requester] {
			if _, ok := got[qid]; !ok {
				if err := s.checkLeaseEntry(ctx, requester, qid); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	return errs, nil
}

// leasesAndSet reads requester's leases hash and renewal set as they were
// at one moment while renewals may run (the simulator checks with its
// leases live): the set read before and after the hash alike, a lease
// joining, leaving or committed to the set did not come between.
func (s *Store) leasesAndSet(ctx context.Context, requester string) (map[string]string, []any, error) {
	read := func() ([]any, error) {
		return s.rdb.HMGet(ctx, s.Key("renewal:", requester), "gen", "pending", "digest").Result()
	}
	for try := 0; ; try++ {
		before, err := read()
		if err != nil {
			return nil, nil, err
		}
		got, err := s.rdb.HGetAll(ctx, s.Key("leases:", requester)).Result()
		if err != nil {
			return nil, nil, err
		}
		after, err := read()
		if err != nil || slices.Equal(before, after) || try == 4 {
			return got, after, err
		}
	}
}

// checkLeaseEntry checks one lease's entry against its record, read entry,
// record, entry until the entry stayed the same around the record's read
// (the scripts write both at once), a few times at most.
func (s *Store) checkLeaseEntry(ctx context.Context, requester, qid string) error {
	lk := s.Key("leases:", requester)
	for try := 0; ; try++ {
		entry, err := s.rdb.HGet(ctx, lk, qid).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		rec, err := s.rdb.HMGet(ctx, s.Key("resv:", qid), "requester", "phase", "lease_ms", "expires_ms").Result()
		if err != nil {
			return err
		}
		again, err := s.rdb.HGet(ctx, lk, qid).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		if entry != again && try < 4 {
			continue
		}
		f := make([]string, 4)
		for i, v := range rec {
			f[i], _ = v.(string)
		}
		live := f[0] == requester && (model.Reservation{Phase: f[1]}).Live() && f[2] != "" && f[2] != "0"
		fields := strings.Fields(entry)
		switch {
		case !live && entry != "":
			return fmt.Errorf("requester %s: leases entry %s = %q names no live lease of it", requester, qid, entry)
		case live && entry == "":
			return fmt.Errorf("requester %s: live lease %s has no leases entry", requester, qid)
		case live && (len(fields) < 2 || len(fields) > 3 || fields[0]+" "+fields[1] != f[2]+" "+f[3]):
			return fmt.Errorf("requester %s: leases entry %s = %q, its record says %q", requester, qid, entry, f[2]+" "+f[3])
		}
		return nil
	}
}

// checkEnded verifies the ended reservations kept (scripts/lib/ended.lua): no
// requester keeps more than Config.MaxEndedPerMember, and each one kept
// (within the retention) is the record of an ended reservation of its
// requester.
func (s *Store) checkEnded(ctx context.Context) ([]error, error) {
	now, err := s.rdb.Time(ctx).Result()
	if err != nil {
		return nil, err
	}
	// A record expires the retention after it ended, at the instant its
	// entry leaves the window: the entries within a few seconds of that
	// edge may lose their records between this read and the next, so they
	// are not judged.
	edge := &redis.ZRangeBy{Min: "(" + strconv.FormatInt(now.Add(-s.cfg.Retention+min(s.cfg.Retention/10, 10*time.Second)).UnixMilli(), 10), Max: "+inf"}
	requesters, err := s.rdb.ZRangeByScore(ctx, s.Key("ended-requesters"), edge).Result()
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, requester := range requesters {
		key := s.Key("ended:", requester)
		if n, err := s.rdb.ZCard(ctx, key).Result(); err != nil {
			return nil, err
		} else if n > int64(s.cfg.MaxEndedPerMember) {
			errs = append(errs, fmt.Errorf("requester %s: %d ended reservations kept, more than %d", requester, n, s.cfg.MaxEndedPerMember))
		}
		qids, err := s.rdb.ZRangeByScore(ctx, key, edge).Result()
		if err != nil {
			return nil, err
		}
		records, err := s.recordFields(ctx, qids, "phase", "requester")
		if err != nil {
			return nil, err
		}
		for i, qid := range qids {
			phase, owner := records[i][0], records[i][1]
			if phase == "" || (model.Reservation{Phase: phase}).Live() || owner != requester {
				errs = append(errs, fmt.Errorf("requester %s: ended reservation %s kept, but its record says phase %q, requester %q", requester, qid, phase, owner))
			}
		}
	}
	return errs, nil
}

// checkUsage verifies each requester's usage (what its limits are checked
// against) against the live reservations: every live one is in the expiry
// set, and a requester without any has no usage.
func (s *Store) checkUsage(ctx context.Context) ([]error, error) {
	qids, err := s.rdb.ZRange(ctx, s.Key("expiry"), 0, -1).Result()
	if err != nil {
		return nil, err
	}
	live, err := s.reservations(ctx, qids)
	if err != nil {
		return nil, err
	}
	want := map[string]model.Usage{}
	for _, r := range live {
		if r.Live() {
			u := want[r.Requester]
			u.Reservations++
			u.Resources = u.Resources.Add(r.Resources)
			want[r.Requester] = u
		}
	}
	got, err := s.Usage(ctx)
	if err != nil {
		return nil, err
	}
	var errs []error
	for requester, u := range want {
		if got[requester] != u {
			errs = append(errs, fmt.Errorf("requester %s: usage %+v != its live reservations %+v", requester, got[requester], u))
		}
	}
	for requester, u := range got {
		if _, ok := want[requester]; !ok {
			errs = append(errs, fmt.Errorf("requester %s: usage %+v without a live reservation", requester, u))
		}
	}
	return errs, nil
}

// checkNodes verifies one cluster's node debits against its live reservations.
func (s *Store) checkNodes(ctx context.Context, c model.Cluster, live []model.Reservation) ([]error, error) {
	listed, err := s.rdb.SMembers(ctx, s.Key("node-listed:", c.ID)).Result()
	if err != nil {
		return nil, err
	}
	var errs []error
	isListed := map[string]bool{}
	for _, id := range listed {
		isListed[id] = true
	}
	want := map[string]model.Resources{}
	for _, r := range live {
		if r.Node == "" {
			continue
		}
		if isListed[r.QID()] {
			delete(isListed, r.QID())
			continue
		}
		want[r.Node] = want[r.Node].Add(r.Resources)
	}
	for id := range isListed {
		errs = append(errs, fmt.Errorf("cluster %s: node-listed holds %s, not a live reservation placed on its nodes", c.ID, id))
	}
	for node, d := range want {
		if got := c.NodesReserved[node]; got != d {
			errs = append(errs, fmt.Errorf("cluster %s node %s: debit %+v != sum of its unlisted live reservations %+v", c.ID, node, got, d))
		}
	}
	for node, got := range c.NodesReserved {
		if _, ok := want[node]; !ok {
			errs = append(errs, fmt.Errorf("cluster %s node %s: debit %+v without an unlisted live reservation", c.ID, node, got))
		}
	}
	for _, n := range c.StoredNodes() {
		// Only what the broker debits can be overbooked by it: a node whose own
		// pods overrun it is the provider's business.
		f, d := n.Free(), n.Reserved
		if (d.CPU > 0 && f.CPU < 0) || (d.Memory > 0 && f.Memory < 0) || (d.GPU > 0 && f.GPU < 0) || (d.Storage > 0 && f.Storage < 0) {
			errs = append(errs, fmt.Errorf("cluster %s node %s: overbooked, debit %+v, free %+v", c.ID, n.Name, d, f))
		}
	}
	return errs, nil
}

// CheckIndex verifies that the candidate index agrees with the cluster hashes
// (CheckInvariant includes it). Like CheckInvariant, call it on a quiet broker.
func (s *Store) CheckIndex(ctx context.Context) error {
	clusters, err := s.Clusters(ctx)
	if err != nil {
		return err
	}
	return s.checkIndex(ctx, clusters)
}

// checkIndex verifies that the candidate index agrees with the cluster hashes
// for every cluster it holds as live.
func (s *Store) checkIndex(ctx context.Context, clusters []model.Cluster) error {
	live, err := s.rdb.ZRange(ctx, s.Key("idx:live"), 0, -1).Result()
	if err != nil {
		return err
	}
	byID := make(map[string]model.Cluster, len(clusters))
	for _, c := range clusters {
		byID[c.ID] = c
	}
	var errs []error
	for _, id := range live {
		c, ok := byID[id]
		if !ok {
			errs = append(errs, fmt.Errorf("index: %s is live but has no cluster hash", id))
			continue
		}
		free, alloc := c.Free(), c.Allocatable
		want := map[string]float64{}
		for _, r := range []struct {
			name        string
			free, alloc int64
		}{{"cpu", free.CPU, alloc.CPU}, {"mem", free.Memory, alloc.Memory}, {"gpu", free.GPU, alloc.GPU}, {"sto", free.Storage, alloc.Storage}} {
			want["idx:free:"+r.name] = float64(r.free)
			want["idx:alloc:"+r.name] = float64(r.alloc)
			h := 0.0
			if r.alloc > 0 {
				h = float64(r.free) / float64(r.alloc)
			}
			want["idx:hfree:"+r.name] = h
		}
		want["idx:hfree:cm"] = (want["idx:hfree:cpu"] + want["idx:hfree:mem"]) / 2
		want["idx:price:cpu"] = float64(c.Prices.CPU)
		want["idx:price:mem"] = float64(c.Prices.Memory)
		want["idx:price:gpu"] = float64(c.Prices.GPU)
		for _, r := range pricePerCoreRatios {
			// float64(...) rounds the product before the sum, as Lua does (no fused multiply-add).
			want["idx:pcm:"+strconv.FormatFloat(r, 'g', -1, 64)] = float64(c.Prices.CPU) + float64(r*float64(c.Prices.Memory))
		}
		for key, w := range want {
			got, err := s.rdb.ZScore(ctx, s.Key(key), id).Result()
			if err != nil {
				errs = append(errs, fmt.Errorf("index: %s of %s: %w", key, id, err))
			} else if got != w {
				errs = append(errs, fmt.Errorf("index: %s of %s is %v, the hash says %v", key, id, got, w))
			}
		}
		nodes := sortedNodes(c)
		wantRec := []float64{float64(alloc.CPU), float64(free.CPU), float64(alloc.Memory), float64(free.Memory),
			float64(alloc.GPU), float64(free.GPU), float64(alloc.Storage), float64(free.Storage),
			float64(c.Prices.CPU), float64(c.Prices.Memory), float64(c.Prices.GPU)}
		wantRec = append(wantRec, nodeSummary(nodes)...)
		if err := s.checkNodeRecord(ctx, id, nodes); err != nil {
			errs = append(errs, err)
		}
		if raw, err := s.rdb.HGet(ctx, s.Key("idx:rec"), id).Result(); err != nil {
			errs = append(errs, fmt.Errorf("index: record of %s: %w", id, err))
		} else if got, err := decodeRecord(raw); err != nil || !slices.Equal(got, wantRec) {
			errs = append(errs, fmt.Errorf("index: record of %s is %v (%v), the hash says %v", id, got, err, wantRec))
		}
		for k, v := range c.Labels {
			if in, err := s.rdb.SIsMember(ctx, s.Key("idx:label:", k, "=", v), id).Result(); err != nil || !in {
				errs = append(errs, fmt.Errorf("index: %s not in the set of label %s=%s (%v)", id, k, v, err))
			}
		}
	}
	return errors.Join(errs...)
}

// sortedNodes are a cluster's nodes in idx:nrec order: most free cpu first, then by name.
func sortedNodes(c model.Cluster) []model.Node {
	nodes := c.StoredNodes()
	slices.SortFunc(nodes, func(a, b model.Node) int {
		if fa, fb := a.Free().CPU, b.Free().CPU; fa != fb {
			return cmp.Compare(fb, fa)
		}
		return strings.Compare(a.Name, b.Name)
	})
	return nodes
}

// nodeSummary is the tail of an idx:rec record (scripts/lib/nodes.lua summarize_nodes).
func nodeSummary(nodes []model.Node) []float64 {
	if len(nodes) == 0 {
		return make([]float64, 9)
	}
	top := nodes[0].Free()
	out := []float64{float64(len(nodes)), float64(top.CPU), float64(top.Memory), float64(top.GPU), float64(top.Storage),
		float64(top.CPU), float64(top.Memory), float64(top.GPU), float64(top.Storage)}
	for _, n := range nodes {
		f := n.Free()
		for i, v := range []int64{f.CPU, f.Memory, f.GPU, f.Storage} {
			out[5+i] = max(out[5+i], float64(v))
		}
	}
	return out
}

// checkNodeRecord verifies a live cluster's idx:nrec against its nodes.
func (s *Store) checkNodeRecord(ctx context.Context, id string, nodes []model.Node) error {
	raw, err := s.rdb.HGet(ctx, s.Key("idx:nrec"), id).Result()
	if errors.Is(err, redis.Nil) {
		if len(nodes) > 0 {
			return fmt.Errorf("index: no node record for %s, which advertises %d nodes", id, len(nodes))
		}
		return nil
	}
	if err != nil {
		return err
	}
	if len(nodes) == 0 {
		return fmt.Errorf("index: node record for %s, which advertises no nodes", id)
	}
	names, f, err := decodeNodeRecord(raw)
	var wantNames []string
	var wantF []float64
	for _, n := range nodes {
		free := n.Free()
		wantNames = append(wantNames, n.Name)
		wantF = append(wantF, float64(free.CPU), float64(free.Memory), float64(free.GPU), float64(free.Storage))
	}
	if err != nil || !slices.Equal(names, wantNames) || !slices.Equal(f, wantF) {
		return fmt.Errorf("index: node record of %s is %v %v (%v), the hashes say %v %v", id, names, f, err, wantNames, wantF)
	}
	return nil
}

// decodeNodeRecord reads an idx:nrec value: a little-endian uint16 count, 4
// doubles per node, the names separated by spaces; or JSON {names, f}.
func decodeNodeRecord(raw string) ([]string, []float64, error) {
	if strings.HasPrefix(raw, "{") && json.Valid([]byte(raw)) {
		var v struct {
			Names []string  `json:"names"`
			F     []float64 `json:"f"`
		}
		err := json.Unmarshal([]byte(raw), &v)
		return v.Names, v.F, err
	}
	if len(raw) < 2 {
		return nil, nil, fmt.Errorf("node record of %d bytes", len(raw))
	}
	n := int(binary.LittleEndian.Uint16([]byte(raw[:2])))
	if len(raw) < 2+32*n {
		return nil, nil, fmt.Errorf("node record of %d bytes for %d nodes", len(raw), n)
	}
	f := make([]float64, 4*n)
	for i := range f {
		f[i] = math.Float64frombits(binary.LittleEndian.Uint64([]byte(raw[2+8*i : 10+8*i])))
	}
	return strings.Fields(raw[2+32*n:]), f, nil
}

// pricePerCoreRatios are the GiB-per-core ratios of the idx:pcm sets (scripts/lib/index.lua RATIOS).
var pricePerCoreRatios = []float64{0, 0.5, 1, 2, 4, 8, 16, 32, 64}

// decodeRecord reads an idx:rec record: 20 little-endian doubles, or a JSON
// array where the scripts run without Lua's struct library.
func decodeRecord(raw string) ([]float64, error) {
	var out []float64
	if strings.HasSuffix(raw, "]") { // a double ending in 0x5d would be above 1e140
		err := json.Unmarshal([]byte(raw), &out)
		return out, err
	}
	if len(raw) != 20*8 {
		return nil, fmt.Errorf("record of %d bytes", len(raw))
	}
	for i := 0; i < len(raw); i += 8 {
		out = append(out, math.Float64frombits(binary.LittleEndian.Uint64([]byte(raw[i:i+8]))))
	}
	return out, nil
}
