package store

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
)

// GrantKeys seal the providers' grants (their tenants' bearer tokens) before
// they reach Redis, with AES-256-GCM: Redis, its append-only file and its
// backups hold no token in clear. The first key seals; every key opens, so a
// new key is rolled out by putting it first and keeping the old one after it
// until the grants it sealed have ended (at most --max-duration).
//
// A sealed value is "v1.<key id>.<nonce || ciphertext>" (those bytes in
// base64url in a record's own grant, as they are in a pair's access), bound to
// where it is stored by its additional data: a pair's access (what a
// provider grants every reservation of a requester) to the pair, the grant a
// broker of the previous release wrote into a record to its reservation's
// qualified id. Copied elsewhere, it does not open.
type GrantKeys struct {
	keys []grantKey
}

type grantKey struct {
	id   string // hex of the first 4 bytes of SHA-256 of the key: names it, reveals nothing
	aead cipher.AEAD
}

// GrantKeySize is the size of a grant key: 32 bytes (AES-256).
const GrantKeySize = 32

// sealedPrefix starts every sealed grant.
const sealedPrefix = "v1."

// NewGrantKeys returns keys sealing with the first of raw and opening with
// every one; each must be GrantKeySize bytes.
func NewGrantKeys(raw ...[]byte) (*GrantKeys, error) {
	if len(raw) == 0 {
		return nil, errors.New("no grant key")
	}
	k := &GrantKeys{}
	for i, key := range raw {
		if len(key) != GrantKeySize {
			return nil, fmt.Errorf("grant key %d: %d bytes, want %d", i+1, len(key), GrantKeySize)
		}
		block, err := aes.NewCipher(key)
		if err != nil {
			return nil, err
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, err
		}
		sum := sha256.Sum256(key)
		k.keys = append(k.keys, grantKey{id: hex.EncodeToString(sum[:4]), aead: aead})
	}
	return k, nil
}

// ParseGrantKeys reads a key file (--grant-key-file): one key per line,
// base64 of 32 random bytes (`openssl rand -base64 32`), the sealing key
// first; blank lines and lines starting with # are ignored. Its errors name
// lines, never the keys.
func ParseGrantKeys(data []byte) (*GrantKeys, error) {
	var raw [][]byte
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, err := base64.StdEncoding.DecodeString(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: not base64", i+1)
		}
		if len(key) != GrantKeySize {
			return nil, fmt.Errorf("line %d: %d bytes, want %d (openssl rand -base64 32)", i+1, len(key), GrantKeySize)
		}
		raw = append(raw, key)
	}
	if len(raw) == 0 {
		return nil, errors.New("no key in the file (one per line: openssl rand -base64 32)")
	}
	return NewGrantKeys(raw...)
}

// LoadGrantKeys reads a key file (ParseGrantKeys).
func LoadGrantKeys(path string) (*GrantKeys, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	k, err := ParseGrantKeys(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return k, nil
}

// RandomGrantKeys returns a key of this process only: grants it seals open
// in no other process, so it serves a single broker (tests).
func RandomGrantKeys() *GrantKeys {
	key := make([]byte, GrantKeySize)
	_, _ = rand.Read(key) // never fails (crypto/rand)
	k, err := NewGrantKeys(key)
	if err != nil {
		panic(err)
	}
	return k
}

// seal seals reservation qid's grant (brokers of the previous release
// stored grants so; tests write such records).
func (k *GrantKeys) seal(qid string, grant []byte) string {
	id, sealed := k.sealWith([]byte(qid), grant)
	return sealedPrefix + id + "." + base64.RawURLEncoding.EncodeToString(sealed)
}

// open opens reservation qid's stored grant. A grant in clear (JSON, as
// brokers before sealing stored it) is returned as it is: it goes when its
// reservation ends.
func (k *GrantKeys) open(qid, stored string) ([]byte, error) {
	if strings.HasPrefix(stored, "{") {
		return []byte(stored), nil
	}
	what := "grant of " + qid
	id, body, err := cutSealed(stored, what)
	if err != nil {
		return nil, err
	}
	sealed, err := base64.RawURLEncoding.DecodeString(body)
	if err != nil {
		return nil, fmt.Errorf("%s: malformed sealed value", what)
	}
	return k.openWith([]byte(qid), id, sealed, what, "another reservation")
}

// pairData is the additional data of a pair's sealed access, which names the
// pair: copied to another pair's key, it does not open. (A reservation's
// qualified id never starts with "pair:": cluster ids hold no ':'.)
func pairData(provider, requester string) []byte {
	return []byte("pair:" + provider + "/" + requester)
}

// sealAccess seals the access provider grants requester (a grant without its
// placement), stored once for the pair (scripts/lib/grants.lua). The sealed
// bytes follow "v1.<key id>." as they are, not in base64: a quarter less
// of Redis for the largest value it holds per pair.
func (k *GrantKeys) sealAccess(provider, requester string, access []byte) string {
	id, sealed := k.sealWith(pairData(provider, requester), access)
	return sealedPrefix + id + "." + string(sealed)
}

// openAccess opens the access stored for the pair of provider and requester.
func (k *GrantKeys) openAccess(provider, requester, stored string) ([]byte, error) {
	what := "access of " + provider + " to " + requester
	id, body, err := cutSealed(stored, what)
	if err != nil {
		return nil, err
	}
	return k.openWith(pairData(provider, requester), id, []byte(body), what, "another pair's key")
}

// cutSealed splits a sealed value into its key id and its body.
func cutSealed(stored, what string) (id, body string, err error) {
	rest, ok := strings.CutPrefix(stored, sealedPrefix)
	id, body, ok2 := strings.Cut(rest, ".")
	if !ok || !ok2 {
		return "", "", fmt.Errorf("%s: not sealed", what)
	}
	return id, body, nil
}

// sealWith seals plain with the first key and additional data data: the
// key's id and nonce || ciphertext.
func (k *GrantKeys) sealWith(data, plain []byte) (string, []byte) {
	key := k.keys[0]
	nonce := make([]byte, key.aead.NonceSize(), key.aead.NonceSize()+len(plain)+key.aead.Overhead())
	_, _ = rand.Read(nonce)
	return key.id, key.aead.Seal(nonce, nonce, plain, data)
}

// openWith opens nonce || ciphertext sealed by key id with additional data
// data; what names it in errors, elsewhere where a copy would come from.
func (k *GrantKeys) openWith(data []byte, id string, sealed []byte, what, elsewhere string) ([]byte, error) {
	for _, key := range k.keys {
		if key.id != id {
			continue
		}
		n := key.aead.NonceSize()
		if len(sealed) < n {
			return nil, fmt.Errorf("%s: malformed sealed value", what)
		}
		plain, err := key.aead.Open(nil, sealed[:n], sealed[n:], data)
		if err != nil {
			return nil, fmt.Errorf("%s does not open with key %s: altered, or copied from %s", what, id, elsewhere)
		}
		return plain, nil
	}
	return nil, fmt.Errorf("%s was sealed with key %s, which this broker does not have: give every replica the same --grant-key-file", what, id)
}
