package api

import (
	"io"
	"strings"
)

// DecodeRenewRequest reads a renewal's body as Decode would. The body of an
// agent's renewal, {"ids":["...",...]} with ids of the characters a
// reservation id may hold (no escapes), is read by a scanner of that one
// shape, ten times cheaper than the reflecting decoder for the largest
// bodies (about 1 MB); anything else (other keys, escapes, null, a
// malformed body) is decoded by Decode, with its answer and its error.
// FuzzDecodeRenewRequest holds the two to one answer. size is the body's
// length if known (Content-Length; -1: not known), to read it in one buffer.
func DecodeRenewRequest(r io.Reader, size int64) (RenewRequest, error) {
	data, err := readBody(r, min(size, MaxRenewBodyBytes))
	if err != nil {
		return RenewRequest{}, err
	}
	if ids, ok := scanRenewIDs(data); ok {
		return RenewRequest{IDs: ids}, nil
	}
	var body RenewRequest
	if err := decodeStrict(data, &body); err != nil {
		return RenewRequest{}, err
	}
	return body, nil
}

// scanRenewIDs reads exactly `{"ids":[...]}` (JSON whitespace anywhere
// between tokens) whose strings hold only [a-z0-9.-]; ok is false for
// anything else. The ids share one copy of the body.
func scanRenewIDs(data []byte) (ids []string, ok bool) {
	body := string(data)
	i := skipSpace(body, 0)
	if !hasAt(body, i, `{`) {
		return nil, false
	}
	i = skipSpace(body, i+1)
	if !hasAt(body, i, `"ids"`) {
		return nil, false
	}
	i = skipSpace(body, i+5)
	if !hasAt(body, i, `:`) {
		return nil, false
	}
	i = skipSpace(body, i+1)
	if !hasAt(body, i, `[`) {
		return nil, false
	}
	i = skipSpace(body, i+1)
	ids = make([]string, 0, min(strings.Count(body, ","), MaxRenewBatch)+1)
	if hasAt(body, i, `]`) {
		i++
	} else {
		for {
			if !hasAt(body, i, `"`) {
				return nil, false
			}
			end := i + 1
			for end < len(body) && idByte[body[end]] {
				end++
			}
			if !hasAt(body, end, `"`) {
				return nil, false
			}
			ids = append(ids, body[i+1:end])
			i = skipSpace(body, end+1)
			if hasAt(body, i, `]`) {
				i++
				break
			}
			if !hasAt(body, i, `,`) {
				return nil, false
			}
			i = skipSpace(body, i+1)
		}
	}
	i = skipSpace(body, i)
	if !hasAt(body, i, `}`) {
		return nil, false
	}
	return ids, skipSpace(body, i+1) == len(body)
}

func hasAt(s string, i int, tok string) bool {
	return i+len(tok) <= len(s) && s[i:i+len(tok)] == tok
}

// skipSpace returns the index of the first byte at or after i that is not
// JSON whitespace.
func skipSpace(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
		i++
	}
	return i
}

// idByte: the bytes a reservation id may hold ([a-z0-9.-]).
var idByte = func() (t [256]bool) {
	for c := range 256 {
		t[c] = c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.'
	}
	return t
}()
