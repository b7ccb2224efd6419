package client

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/fluidos-project/resource-broker/broker/api"
)

// APIError is an error answer of the broker: a non-2xx status with, normally,
// an api.Error body.
type APIError struct {
	StatusCode int
	// Reason is the broker's machine-readable reason (api.ReasonNoCapacity,
	// api.ReasonNotFound, ...); empty when the body was not an api.Error, for
	// example from a proxy in front of the broker.
	Reason string
	// Message is the broker's human-readable message (or the start of the body).
	Message string
	// Rejected counts, for a NoCapacity answer, the clusters excluded by
	// reason: stale, requester, selector, insufficient_cpu, insufficient_mem, ...
	Rejected map[string]int64
	// RetryAfter is the server's Retry-After, when it sent one in seconds.
	RetryAfter time.Duration
	// Method and Path say which call failed.
	Method, Path string
}

func (e *APIError) Error() string {
	var b strings.Builder
	if e.Method != "" {
		fmt.Fprintf(&b, "%s %s: ", e.Method, e.Path)
	}
	fmt.Fprintf(&b, "broker answered %d", e.StatusCode)
	if e.Reason != "" {
		b.WriteString(" " + e.Reason)
	}
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	} else if len(e.Rejected) > 0 {
		keys := make([]string, 0, len(e.Rejected))
		for k := range e.Rejected {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for i, k := range keys {
			sep := ", "
			if i == 0 {
				sep = ": "
			}
			fmt.Fprintf(&b, "%s%s=%d", sep, k, e.Rejected[k])
		}
	}
	return b.String()
}

// newAPIError decodes an error answer; body is at most a few KiB of it.
func newAPIError(method, path string, resp *http.Response, body []byte) *APIError {
	e := &APIError{StatusCode: resp.StatusCode, Method: method, Path: path}
	var ae api.Error
	if err := jsonUnmarshal(body, &ae); err == nil && (ae.Reason != "" || ae.Error != "") {
		e.Reason, e.Message, e.Rejected = ae.Reason, ae.Error, ae.Rejected
	} else {
		msg := strings.TrimSpace(string(body))
		if len(msg) > 512 {
			msg = msg[:512] + "..."
		}
		if msg == "" {
			msg = http.StatusText(resp.StatusCode)
		}
		e.Message = msg
	}
	if ra := resp.Header.Get("Retry-After"); ra != "" {
		var secs int
		if _, err := fmt.Sscanf(ra, "%d", &secs); err == nil && secs >= 0 {
			e.RetryAfter = time.Duration(secs) * time.Second
		}
	}
	return e
}

func asAPIError(err error) (*APIError, bool) {
	var ae *APIError
	ok := errors.As(err, &ae)
	return ae, ok
}

// IsNoCapacity reports whether a reservation was refused because no cluster
// fits it (409 NoCapacity); the *APIError's Rejected says why.
func IsNoCapacity(err error) bool {
	ae, ok := asAPIError(err)
	return ok && ae.Reason == api.ReasonNoCapacity
}

// IsNotFound reports a 404: no such cluster or reservation, or a
// reservation the caller is not a party to (the broker answers both alike).
func IsNotFound(err error) bool {
	ae, ok := asAPIError(err)
	return ok && ae.StatusCode == http.StatusNotFound
}

// IsForbidden reports a 403 (or 401): the caller's identity may not do this,
// e.g. it advertises another cluster, or grants its own reservation.
func IsForbidden(err error) bool {
	ae, ok := asAPIError(err)
	return ok && (ae.StatusCode == http.StatusForbidden || ae.StatusCode == http.StatusUnauthorized)
}

// OverLimit returns the broker's 429 LimitExceeded or RateLimited answer:
// the requester is at one of the limits the operator set (broker/policy).
// Its Reason names which kind, its Message the limit, and RetryAfter when to
// try again. Such an answer is also retryable (IsRetryable).
func OverLimit(err error) (*APIError, bool) {
	ae, ok := asAPIError(err)
	if !ok || ae.StatusCode != http.StatusTooManyRequests ||
		(ae.Reason != api.ReasonLimitExceeded && ae.Reason != api.ReasonRateLimited) {
		return nil, false
	}
	return ae, true
}

// IsBusy reports a 503 Busy: the broker replica shed the call, which waited
// too long for its turn (an advertisement), and did nothing. Such an answer
// is retryable and carries a Retry-After (RetryAfter).
func IsBusy(err error) bool {
	ae, ok := asAPIError(err)
	return ok && ae.StatusCode == http.StatusServiceUnavailable && ae.Reason == api.ReasonBusy
}

// RetryAfter is the wait a retryable answer (5xx, 429) asked for in its
// Retry-After, and whether it asked.
func RetryAfter(err error) (time.Duration, bool) {
	ae, ok := asAPIError(err)
	if !ok || ae.RetryAfter <= 0 || !IsRetryable(err) {
		return 0, false
	}
	return ae.RetryAfter, true
}

// IsConflict reports a 409 other than NoCapacity and AdvertisementNeeded:
// the reservation id belongs to another requester, or the reservation has
// ended (a grant came too late).
func IsConflict(err error) bool {
	ae, ok := asAPIError(err)
	return ok && ae.StatusCode == http.StatusConflict && ae.Reason != api.ReasonNoCapacity && ae.Reason != api.ReasonAdvertisementNeeded
}

// IsAdvertisementNeeded reports the broker's 409 AdvertisementNeeded to a
// heartbeat: it does not hold the advertisement named, or the cluster went
// stale; nothing was written, advertise in full now.
func IsAdvertisementNeeded(err error) bool {
	ae, ok := asAPIError(err)
	return ok && ae.StatusCode == http.StatusConflict && ae.Reason == api.ReasonAdvertisementNeeded
}

// IsRetryable reports whether trying the same call again later may succeed:
// transport errors (connection refused or reset, timeouts, an event stream
// cut off), 5xx answers (503 Unavailable when the broker lost Redis) and 429.
// It is false for answers about the request itself (4xx), for a cancelled
// context, and for TLS failures that only a configuration change fixes (the
// server's or our certificate was refused).
func IsRetryable(err error) bool {
	if err == nil {
		return false
	}
	if ae, ok := asAPIError(err); ok {
		return ae.StatusCode >= 500 || ae.StatusCode == http.StatusTooManyRequests
	}
	if errors.Is(err, context.Canceled) || isTLSRefusal(err) {
		return false
	}
	var se *StreamError
	if errors.As(err, &se) {
		return true
	}
	var ne net.Error
	var ue *url.Error
	switch {
	case errors.As(err, &ne), errors.As(err, &ue):
		return true
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, context.DeadlineExceeded):
		return true
	}
	return false
}

// isTLSRefusal reports a TLS failure that retrying does not fix: the server's
// certificate did not verify, or the server refused ours (a TLS alert).
func isTLSRefusal(err error) bool {
	var (
		verr  *tls.CertificateVerificationError
		uaerr x509.UnknownAuthorityError
		cierr x509.CertificateInvalidError
		hnerr x509.HostnameError
		rherr tls.RecordHeaderError
		alerr tls.AlertError
		operr *net.OpError
	)
	if errors.As(err, &verr) || errors.As(err, &uaerr) || errors.As(err, &cierr) || errors.As(err, &hnerr) ||
		errors.As(err, &rherr) || errors.As(err, &alerr) {
		return true
	}
	// crypto/tls reports an alert from the peer (bad certificate, unknown
	// certificate authority, certificate required, ...) as a *net.OpError
	// "remote error" wrapping an unexported type.
	return errors.As(err, &operr) && operr.Op == "remote error"
}
