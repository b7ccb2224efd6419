package main

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"math/big"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fluidos-project/resource-broker/broker/api"
)

// grants are what the providers post with --grant: after each reservation
// granted, its provider (the target member, with its own client) grants it,
// as agent/provider does once it holds the capacity. The access is the same
// for all of a provider's grants to one requester (its tenant namespace and
// the tenant ServiceAccount's token, as agent/provider reuses one token per
// requester), of realistic sizes: an RSA-2048 CA bundle (about 1.1 KB of
// PEM) and a token of about 900 bytes, expiring an hour after its first
// grant; the placement is the reservation's node.
type grants struct {
	caBundle []byte
	mu       sync.Mutex
	access   map[string]api.Grant // provider + "/" + requester -> its access
}

func newGrants() (*grants, error) {
	ca, err := selfSignedPEM()
	if err != nil {
		return nil, err
	}
	return &grants{caBundle: ca, access: map[string]api.Grant{}}, nil
}

// selfSignedPEM is a CA certificate as a Kubernetes API server's bundle
// holds one: RSA-2048, PEM.
func selfSignedPEM() ([]byte, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kubernetes"},
		NotBefore: now, NotAfter: now.AddDate(10, 0, 0), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// accessOf is the access provider grants requester: made at its first
// grant, the same afterwards.
func (g *grants) accessOf(provider, requester string) api.Grant {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := provider + "/" + requester
	a, ok := g.access[k]
	if !ok {
		a = api.Grant{Endpoint: "https://" + provider + ".example:6443", CABundle: g.caBundle, Token: serviceAccountToken(k),
			Namespace: "rb-" + requester, ExpiresAt: time.Now().Add(time.Hour).UTC().Truncate(time.Second)}
		g.access[k] = a
	}
	return a
}

// serviceAccountToken is a token of the size of a bound ServiceAccount
// token (a signed JWT of about 900 bytes), different for every pair.
func serviceAccountToken(pair string) string {
	var b strings.Builder
	b.WriteString("eyJhbGciOiJSUzI1NiIsImtpZCI6IjRrVjJ4In0.")
	for i := 0; b.Len() < 900; i++ {
		sum := sha256.Sum256([]byte(pair + "#" + strconv.Itoa(i)))
		b.WriteString(base64.RawURLEncoding.EncodeToString(sum[:]))
	}
	return b.String()[:900]
}

// grant posts the grant of reservation r of requester m, from its provider.
func (s *sim) grant(ctx context.Context, m *member, r api.Reservation) {
	provider := s.memberByID(r.Provider)
	if provider == nil {
		s.recorder().count("grant", "unknown provider "+r.Provider)
		return
	}
	g := s.grants.accessOf(r.Provider, m.id)
	g.Placement = &api.Placement{Node: r.Node, PriorityClassName: "rb-tenant"}
	start := time.Now()
	_, err := provider.client.GrantTo(ctx, m.id, r.ID, g)
	s.recorder().observe("grant", time.Since(start), err)
}

// memberByID is the member of id "c<index>" (makeMembers), nil if none.
func (s *sim) memberByID(id string) *member {
	i, err := strconv.Atoi(strings.TrimPrefix(id, "c"))
	if err != nil || i < 0 || i >= len(s.members) {
		return nil
	}
	return s.members[i]
}
