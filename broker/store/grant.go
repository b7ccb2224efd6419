package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// A grant is split as it is stored (scripts/lib/grants.lua): its access, the
// same for every reservation of a requester at one provider (endpoint, CA
// bundle, token, namespace, expiry), goes to the pair's key, sealed for the
// pair; its placement, the reservation's own, to the record. The grant is the
// API's JSON (broker/api Grant), of which the store reads two fields.
const (
	grantPlacement = "placement"
	grantExpiresAt = "expiresAt"
)

// grantParts is a grant as the store keeps it.
type grantParts struct {
	access    []byte // the grant without its placement
	expiresMs int64  // the access' expiry (0: none given): the newest is the pair's
	placed    bool   // the grant has a placement
	placement placement
}

// placement is the grant's placement, as the API writes it.
type placement struct {
	Node              string `json:"node"`
	PriorityClassName string `json:"priorityClassName"`
}

// splitGrant reads a grant into what the pair's key and the record keep.
func splitGrant(grant []byte) (grantParts, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(grant, &fields); err != nil {
		return grantParts{}, fmt.Errorf("grant: %w", err)
	}
	var p grantParts
	if raw, ok := fields[grantPlacement]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &p.placement); err != nil {
			return grantParts{}, fmt.Errorf("grant: placement: %w", err)
		}
		p.placed = true
	}
	delete(fields, grantPlacement)
	if raw, ok := fields[grantExpiresAt]; ok {
		var t time.Time
		if err := json.Unmarshal(raw, &t); err != nil {
			return grantParts{}, fmt.Errorf("grant: expiresAt: %w", err)
		}
		p.expiresMs = max(t.UnixMilli(), 0)
	}
	access, err := json.Marshal(fields)
	if err != nil {
		return grantParts{}, err
	}
	p.access = access
	return p, nil
}

// composeGrant is the grant of record m: the access of its pair, opened,
// with the record's placement (place_node, place_class) if it has one.
func composeGrant(access []byte, m map[string]string) ([]byte, error) {
	node, placed := m["place_node"]
	if !placed {
		return access, nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(access, &fields); err != nil {
		return nil, fmt.Errorf("access: %w", err)
	}
	p, err := json.Marshal(placement{Node: node, PriorityClassName: m["place_class"]})
	if err != nil {
		return nil, err
	}
	fields[grantPlacement] = p
	return json.Marshal(fields)
}

// grantKey is the key of the access provider grants requester.
func (s *Store) grantKey(provider, requester string) string {
	return s.Key("grant:", provider, ":", requester)
}

// withAccesses adds to each record of records (HGETALL maps) that holds a
// share of its pair's access the pair's sealed access, as field "access",
// as the scripts do in their replies (grants.lua with_access): one pipeline
// for them all, none when no record holds a share.
func (s *Store) withAccesses(ctx context.Context, records []map[string]string) error {
	pipe := s.rdb.Pipeline()
	held := map[string]*redis.SliceCmd{}
	for _, m := range records {
		if m["grant_gen"] == "" {
			continue
		}
		k := s.grantKey(m["target"], m["requester"])
		if held[k] == nil {
			held[k] = pipe.HMGet(ctx, k, "sealed", "gen")
		}
	}
	if len(held) == 0 {
		return nil
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return err
	}
	for _, m := range records {
		if m["grant_gen"] == "" {
			continue
		}
		v := held[s.grantKey(m["target"], m["requester"])].Val()
		sealed, _ := v[0].(string)
		gen, _ := v[1].(string)
		if sealed != "" && gen == m["grant_gen"] {
			m["access"] = sealed
		}
	}
	return nil
}
