// Package readapi is the read service: what a tenant reads of its runs
// (their stored events, the tenant's runs since a time, audit records,
// artifacts, the catalog) answered by request/reply on
// {prefix}.api.{tenant}.{op} from the services' JetStream. Tenants hold no
// JetStream of their own (a tenant is a NATS account without it); the read
// service is how they read.
//
// The tenant comes only from the subject's tenant token, which a tenant
// account's import of the service fixes; every filter is built here from
// validated run ids and verbs, never from a subject the caller sends.
// Every page is bounded in messages and bytes (under the connection's max
// payload), and no read creates a consumer: messages are read with direct
// gets.
//
// This file is the wire format and its pure rules; service.go is the I/O
// shell; call.go is the caller's side, for package client.
package readapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
)

// Operations of the read service (the last subject token).
const (
	// OpEvents reads the stored events of one run, from the runs or the
	// requests stream.
	OpEvents = "events"
	// OpRuns reads the stored run events of every run of the tenant
	// (the runs stream).
	OpRuns = "runs"
	// OpAudit reads the audit records of one run or of the tenant.
	OpAudit = "audit"
	// OpArtifact reads an artifact of the tenant in bounded chunks.
	OpArtifact = "artifact"
	// OpCatalog reads the public action listing and the skills.
	OpCatalog = "catalog"
	// OpApprovals reads one run's approval subject only (approval
	// requests and the dispatcher's answers): all a tenant's approver
	// user may read, where its client reads everything of the tenant.
	OpApprovals = "approvals"
)

// Ops are the read service's operations.
var Ops = []string{OpEvents, OpRuns, OpAudit, OpArtifact, OpCatalog, OpApprovals}

// approvalVerbs are what OpApprovals reads of a run.
var approvalVerbs = []string{"approval"}

// Streams an events request may name.
const (
	StreamRuns     = "runs"
	StreamRequests = "requests"
)

// Catalog kinds.
const (
	KindActions = "actions"
	KindSkills  = "skills"
)

// Bounds of a request.
const (
	// MaxRequestBytes bounds a request body.
	MaxRequestBytes = 4 << 10
	// DefaultLimit is the messages of a page when a request names none.
	DefaultLimit = 256
	// MaxLimit is the most messages one page holds.
	MaxLimit = 1024
	// MaxVerbs bounds the verbs of one events request.
	MaxVerbs = 8
	// MinPageBytes is the smallest page a caller may ask for.
	MinPageBytes = 4 << 10
)

// Request is one read. Each operation reads the fields it documents and
// refuses the others (bad_request).
type Request struct {
	// Run is the run id: required by events, optional for audit (the
	// tenant's records otherwise).
	Run string `json:"run,omitempty"`
	// Stream is the stream of an events read: "runs" (the default, what
	// services publish) or "requests" (what clients and approvers
	// publish).
	Stream string `json:"stream,omitempty"`
	// Verbs limit an events read to these subject verbs (at most 8, each
	// a verb of Stream).
	Verbs []string `json:"verbs,omitempty"`
	// Last makes an events read return the last stored event of each of
	// Verbs (which it requires) instead of a page.
	Last bool `json:"last,omitempty"`
	// After starts the page after this stream sequence (events, runs,
	// audit, artifact); 0 starts at the first.
	After uint64 `json:"after,omitempty"`
	// Offset continues a message that a previous page cut: the page holds
	// only the first message after After, from this byte of its data.
	Offset int `json:"offset,omitempty"`
	// Since starts a runs or audit page at the first message stored at or
	// after this time (when After is 0).
	Since *time.Time `json:"since,omitempty"`
	// HeadersOnly leaves the events' data out (events).
	HeadersOnly bool `json:"headersOnly,omitempty"`
	// Limit bounds the messages of a page; default 256, at most 1024.
	Limit int `json:"limit,omitempty"`
	// MaxBytes bounds the encoded page (the caller's max payload); the
	// service's own bound applies when it is 0 or larger; at least 4096.
	MaxBytes int `json:"maxBytes,omitempty"`
	// ID is the artifact id (artifact).
	ID string `json:"id,omitempty"`
	// Kind is "actions" or "skills" (catalog).
	Kind string `json:"kind,omitempty"`
	// Name is one skill's name (catalog, kind skills).
	Name string `json:"name,omitempty"`
	// From starts a catalog page after this action name.
	From string `json:"from,omitempty"`
}

// Msg is one stored message of a page.
type Msg struct {
	Seq     uint64              `json:"seq"`
	Subject string              `json:"subject"`
	Time    time.Time           `json:"time"`
	Header  map[string][]string `json:"header,omitempty"`
	Data    []byte              `json:"data,omitempty"`
	// Size is the stored data's length; Offset is where Data starts in
	// it. A message with Offset+len(Data) < Size was cut: ask again with
	// After = Seq-1 and Offset = Offset+len(Data) for the rest.
	Size   int `json:"size"`
	Offset int `json:"offset,omitempty"`
}

// Cut reports whether m holds only part of its data.
func (m Msg) Cut() bool { return m.Offset+len(m.Data) < m.Size }

// Page is the answer of events, runs and audit.
type Page struct {
	Msgs []Msg `json:"msgs"`
	// Next is the sequence to ask After for the next page.
	Next uint64 `json:"next"`
	// More reports that more messages matched when the page was cut.
	More bool `json:"more"`
}

// Chunk is the answer of artifact: a run of the artifact's bytes.
type Chunk struct {
	// Size is the artifact's size in bytes.
	Size int64 `json:"size"`
	// Digest is the object store's digest ("SHA-256=<base64url>").
	Digest string `json:"digest,omitempty"`
	// MediaType is the artifact's media type.
	MediaType string `json:"mediaType,omitempty"`
	// Data are the bytes of this chunk, following those of the chunks
	// before it.
	Data []byte `json:"data,omitempty"`
	// Next is the sequence to ask After for the next chunk.
	Next uint64 `json:"next"`
	// Done reports that Data holds the artifact's last byte.
	Done bool `json:"done"`
}

// CatalogPage is the answer of catalog.
type CatalogPage struct {
	// Actions are action catalog entries (kind actions), sorted by name,
	// as JSON objects.
	Actions []json.RawMessage `json:"actions,omitempty"`
	// Skills are skills (kind skills), sorted by name, as JSON objects.
	Skills []json.RawMessage `json:"skills,omitempty"`
	// More reports that the page was cut: ask again with From = the last
	// action's name.
	More bool `json:"more"`
}

// badRequest is the error of a request that is not the documented JSON.
func badRequest(format string, args ...any) *actionbus.Error {
	return actionbus.Errorf(actionbus.CodeBadRequest, "read service: "+format, args...)
}

// Decode decodes and validates the request of op. The error is an
// *actionbus.Error: bad_request for anything but a documented request,
// invalid_run_id for a run id that is not a ULID.
func Decode(op string, body []byte) (Request, error) {
	var r Request
	if len(body) > MaxRequestBytes {
		return r, badRequest("a request is at most %d bytes", MaxRequestBytes)
	}
	if len(bytes.TrimSpace(body)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&r); err != nil {
			return Request{}, badRequest("the request is not the documented JSON")
		}
		if _, err := dec.Token(); err != io.EOF {
			return Request{}, badRequest("the request holds more than one JSON value")
		}
	}
	if err := r.validate(op); err != nil {
		return Request{}, err
	}
	return r, nil
}

// validate checks the fields of op and refuses the others.
func (r Request) validate(op string) error {
	if r.Limit < 0 || r.Limit > MaxLimit {
		return badRequest("limit must be 0 to %d", MaxLimit)
	}
	if r.MaxBytes != 0 && r.MaxBytes < MinPageBytes {
		return badRequest("maxBytes must be at least %d", MinPageBytes)
	}
	if r.Offset < 0 || (r.Offset > 0 && r.Since != nil) {
		return badRequest("offset continues a cut message after a sequence")
	}
	if r.After != 0 && r.Since != nil {
		return badRequest("after and since are exclusive")
	}
	unused := func(fields map[string]bool) error {
		for name, set := range fields {
			if set {
				return badRequest("%s takes no %s", op, name)
			}
		}
		return nil
	}
	switch op {
	case OpApprovals:
		if err := events.CheckRunID(r.Run); err != nil {
			return err
		}
		return unused(map[string]bool{"stream": r.Stream != "", "verbs": len(r.Verbs) > 0, "last": r.Last, "headersOnly": r.HeadersOnly,
			"since": r.Since != nil, "id": r.ID != "", "kind": r.Kind != "", "name": r.Name != "", "from": r.From != ""})
	case OpEvents:
		if err := events.CheckRunID(r.Run); err != nil {
			return err
		}
		if err := checkVerbs(r.Stream, r.Verbs); err != nil {
			return err
		}
		if r.Last && (len(r.Verbs) == 0 || r.After != 0 || r.Offset != 0) {
			return badRequest("last reads the last event of each verb: it needs verbs, and no after or offset")
		}
		return unused(map[string]bool{"since": r.Since != nil, "id": r.ID != "", "kind": r.Kind != "", "name": r.Name != "", "from": r.From != ""})
	case OpRuns, OpAudit:
		if op == OpAudit && r.Run != "" {
			if err := events.CheckRunID(r.Run); err != nil {
				return err
			}
		}
		return unused(map[string]bool{"run": op == OpRuns && r.Run != "", "stream": r.Stream != "", "verbs": len(r.Verbs) > 0,
			"last": r.Last, "headersOnly": r.HeadersOnly, "id": r.ID != "", "kind": r.Kind != "", "name": r.Name != "", "from": r.From != ""})
	case OpArtifact:
		if !events.ValidRunID(r.ID) { // artifact ids are ULIDs derived from their call or run
			return actionbus.Errorf(actionbus.CodeArtifactNotFound, "artifact ids are ULIDs").WithDetail("artifact", clip(r.ID))
		}
		return unused(map[string]bool{"run": r.Run != "", "stream": r.Stream != "", "verbs": len(r.Verbs) > 0, "last": r.Last,
			"offset": r.Offset != 0, "since": r.Since != nil, "headersOnly": r.HeadersOnly, "limit": r.Limit != 0, "kind": r.Kind != "",
			"name": r.Name != "", "from": r.From != ""})
	case OpCatalog:
		switch r.Kind {
		case KindActions:
			if r.Name != "" {
				return badRequest("catalog of actions takes no name (from starts a page)")
			}
		case KindSkills:
			if r.Name != "" && !skillName.MatchString(r.Name) {
				return actionbus.Errorf(actionbus.CodeSkillNotFound, "skill %q is not in the catalog", clip(r.Name)).
					WithDetail("skillName", clip(r.Name))
			}
		default:
			return badRequest("catalog kind must be %q or %q", KindActions, KindSkills)
		}
		if len(r.Name) > 128 || len(r.From) > 256 {
			return badRequest("names are at most 128 bytes")
		}
		return unused(map[string]bool{"run": r.Run != "", "stream": r.Stream != "", "verbs": len(r.Verbs) > 0, "last": r.Last,
			"after": r.After != 0, "offset": r.Offset != 0, "since": r.Since != nil, "headersOnly": r.HeadersOnly, "limit": r.Limit != 0,
			"id": r.ID != ""})
	}
	return badRequest("no operation %q (operations: %s)", clip(op), strings.Join(Ops, ", "))
}

// skillName is the rule of skill names (package skills): a skill name
// becomes a subject token of the catalog bucket's keys.
var skillName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,63}$`)

// checkVerbs checks the stream and verbs of an events request.
func checkVerbs(stream string, verbs []string) error {
	known := events.IsServiceVerb
	switch stream {
	case "", StreamRuns:
	case StreamRequests:
		known = events.IsRequestVerb
	default:
		return badRequest("stream must be %q or %q", StreamRuns, StreamRequests)
	}
	if len(verbs) > MaxVerbs {
		return badRequest("at most %d verbs", MaxVerbs)
	}
	for i, v := range verbs {
		if !known(v) {
			return badRequest("%q is not a verb of the %s stream", clip(v), orDefault(stream, StreamRuns))
		}
		for _, w := range verbs[:i] {
			if w == v {
				return badRequest("verb %q is named twice", v)
			}
		}
	}
	return nil
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// limit returns the request's message bound.
func (r Request) limit() int {
	if r.Limit == 0 {
		return DefaultLimit
	}
	return r.Limit
}

// pageBytes returns the byte bound of a page: the service's bound, or
// the request's when smaller.
func (r Request) pageBytes(service int) int {
	if r.MaxBytes > 0 && r.MaxBytes < service {
		return r.MaxBytes
	}
	return service
}

// PageBudget is the byte bound of a page on a connection whose server
// takes maxPayload bytes in one message: the max payload less a margin
// for the reply's own headers and framing (16 KiB, or a quarter of a
// small max payload).
func PageBudget(maxPayload int64) int {
	margin := min(int64(16<<10), maxPayload/4)
	return int(maxPayload - margin)
}

// stored is a message as read from a stream.
type stored struct {
	seq     uint64
	subject string
	time    time.Time
	header  map[string][]string
	data    []byte
	// pending is how many messages matching the read's filter follow
	// this one.
	pending uint64
}

// fill builds a page from msgs (in stream order, the first starting at
// offset bytes of its data) holding at most limit messages and at most
// budget bytes of JSON. keep drops the messages that do not belong to
// the page (they still advance Next). A first message too large for the
// budget is cut: its data is split over several pages. Headers-only
// messages carry no data and a Size of 0. The error is payload_too_large
// when a message's headers alone are over the budget.
func fill(msgs []stored, offset, limit, budget int, headersOnly bool, keep func(stored) bool) (Page, error) {
	page := Page{Msgs: []Msg{}}
	size := len(`{"msgs":[],"next":18446744073709551615,"more":false}`)
	for i, s := range msgs {
		if len(page.Msgs) == limit {
			page.More = true
			return page, nil
		}
		if !keep(s) {
			page.Next = s.seq
			page.More = s.pending > 0
			continue
		}
		m := Msg{Seq: s.seq, Subject: s.subject, Time: s.time, Header: s.header}
		if !headersOnly {
			m.Data, m.Size = s.data, len(s.data)
			if i == 0 && offset > 0 {
				m.Offset = min(offset, len(s.data))
				m.Data = s.data[m.Offset:]
			}
		}
		n := encodedLen(m) + 1 // the comma
		if size+n <= budget {
			size += n
			page.Msgs = append(page.Msgs, m)
			page.Next = s.seq
			page.More = s.pending > 0
			continue
		}
		if len(page.Msgs) > 0 {
			page.More = true
			return page, nil
		}
		// The first message alone is over the budget: cut its data.
		room := budget - size - (n - base64Len(len(m.Data))) - 8
		if room < 4 {
			return Page{}, (&actionbus.Error{Code: actionbus.CodePayloadTooLarge,
				Message: fmt.Sprintf("read service: the headers of message %d are over the page's %d bytes", s.seq, budget)}).
				WithDetail("limit", budget)
		}
		m.Data = m.Data[:min(len(m.Data), room/4*3)]
		page.Msgs = append(page.Msgs, m)
		page.Next, page.More = s.seq-1, true
		return page, nil
	}
	return page, nil
}

// base64Len is the length of n bytes in standard base64.
func base64Len(n int) int { return (n + 2) / 3 * 4 }

// encodedLen is the length of m as JSON.
func encodedLen(m Msg) int {
	b, err := json.Marshal(m)
	if err != nil {
		return 1 << 30
	}
	return len(b)
}

// errorBody is an error as the reply's body carries it.
func errorBody(err error) (code string, body []byte) {
	abErr, ok := err.(*actionbus.Error)
	if !ok {
		abErr = &actionbus.Error{Code: actionbus.CodeInternal, Message: "read service: " + err.Error()}
	}
	b, mErr := json.Marshal(abErr)
	if mErr != nil {
		b = []byte(fmt.Sprintf(`{"code":%q}`, abErr.Code))
	}
	return string(abErr.Code), b
}
