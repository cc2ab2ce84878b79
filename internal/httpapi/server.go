// Package httpapi is actionbus's HTTP API, for callers without a NATS
// client and for the web console: start a run, get and list runs, follow a
// run's events (server-sent events), list pending approvals, approve or
// deny, read a run's audit chain and the catalog (docs/http.md).
//
// The server talks to NATS as one tenant's client user (and its approver
// user for answers), so NATS enforces the same trust rules as for any
// other client. Every request carries a bearer token mapped to a user and
// roles ([Tokens]).
package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/audit"
)

// Config configures a [Server].
type Config struct {
	// Client starts, follows and reads runs: connected as the tenant's
	// client user. Required.
	Client *client.Client
	// Approver answers approvals: connected as the tenant's approver
	// user. Without it approve and deny answer forbidden.
	Approver *client.Client
	// ApprovalKeyID and ApprovalKey are the server's gateway key
	// ("kid:secret:*" among the dispatcher's approval keys): it signs the
	// grants of approve with the token's user as approver, and the user
	// and grants (policy roles and scopes) of every run it starts. Without
	// a key approve answers forbidden, and runs hold what the policy grants
	// the tenant's NATS clients.
	ApprovalKeyID string
	ApprovalKey   []byte
	// Tokens are the callers. A request without a known bearer token is
	// refused (401).
	Tokens Tokens
	// MaxRuns bounds the runs kept in the index (the oldest ended go
	// first); default 10 000.
	MaxRuns int
	// History is how far back the index reads the runs' events when the
	// server starts (older runs are still found by id); default 24 h.
	History time.Duration
	// MaxWait bounds how long a request waits (?wait= of POST /v1/runs,
	// approvals' answers); default 60 s.
	MaxWait time.Duration
	// Logger receives the server's logs; default slog.Default().
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	if c.MaxRuns == 0 {
		c.MaxRuns = 10000
	}
	if c.MaxWait == 0 {
		c.MaxWait = 60 * time.Second
	}
	if c.History == 0 {
		c.History = 24 * time.Hour
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate reports a missing client, invalid tokens or bounds.
func (c *Config) Validate() error {
	if c.Client == nil {
		return errors.New("httpapi: a client is required")
	}
	if c.MaxRuns < 0 || c.MaxWait < 0 || c.History < 0 {
		return errors.New("httpapi: MaxRuns, MaxWait and History must not be negative")
	}
	return c.Tokens.Validate()
}

// Server serves the API. Call [Server.Run] to keep its view of the runs
// current, and mount [Server.Handler].
type Server struct {
	cfg  Config
	mux  *http.ServeMux
	mu   sync.Mutex
	idx  *Index
	subs map[chan change]struct{}
}

// change is one update of the index sent to /v1/events followers.
type change struct {
	event string
	data  any
}

// New returns a server; the zero Config fields are the defaults.
func New(cfg Config) (*Server, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, mux: http.NewServeMux(), idx: NewIndex(cfg.Client.Tenant(), cfg.MaxRuns), subs: map[chan change]struct{}{}}
	s.route("GET /v1/runs", RoleRead, s.listRuns)
	s.route("POST /v1/runs", RoleRun, s.startRun)
	s.route("GET /v1/runs/{id}", RoleRead, s.getRun)
	s.route("GET /v1/runs/{id}/events", RoleRead, s.runEvents)
	s.route("GET /v1/runs/{id}/audit", RoleRead, s.runAudit)
	s.route("POST /v1/runs/{id}/cancel", RoleRun, s.cancelRun)
	s.route("POST /v1/runs/{id}/input", RoleRun, s.inputRun)
	s.route("POST /v1/runs/{id}/retry", RoleRun, s.retryRun)
	s.route("GET /v1/approvals", RoleRead, s.listApprovals)
	s.route("POST /v1/approvals/{id}/approve", RoleApprove, s.approve)
	s.route("POST /v1/approvals/{id}/deny", RoleApprove, s.deny)
	s.route("GET /v1/catalog", RoleRead, s.catalog)
	s.route("GET /v1/events", RoleRead, s.followIndex)
	s.mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, actionbus.Errorf(actionbus.CodeBadRequest, "no endpoint %s %s (docs/http.md)", r.Method, r.URL.Path))
	})
	return s, nil
}

// Handler serves the API under /v1/.
func (s *Server) Handler() http.Handler { return s.mux }

// Tenant is the tenant whose runs the server serves.
func (s *Server) Tenant() string { return s.cfg.Client.Tenant() }

// route registers an endpoint that needs role.
func (s *Server) route(pattern, role string, h func(http.ResponseWriter, *http.Request, *Token)) {
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		tok, err := s.cfg.Tokens.authenticate(r)
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="actionbus"`)
			writeError(w, actionbus.Errorf(actionbus.CodeUnauthenticated, "%v", err))
			return
		}
		if !tok.May(role) {
			writeError(w, actionbus.Errorf(actionbus.CodeForbidden, "user %s lacks the %s role", tok.User, role))
			return
		}
		h(w, r, tok)
	})
}

// Run keeps the index current from the tenant's run events until ctx
// ends.
func (s *Server) Run(ctx context.Context) error {
	since := time.Now().Add(-s.cfg.History)
	for {
		err := s.cfg.Client.Watch(ctx, since, s.apply)
		if ctx.Err() != nil {
			return nil
		}
		// A stream read that failed (a server moving) is started again:
		// the index applies events idempotently.
		s.cfg.Logger.Warn("httpapi: watching runs failed; watching again", "error", err)
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
			return nil
		}
	}
}

// apply applies one event, reads the run's request once, and tells the
// followers.
func (s *Server) apply(e client.Event) {
	s.mu.Lock()
	v := s.idx.Apply(e)
	needs := v != nil && s.idx.NeedsRequest(e.RunID)
	approvals := e.Type == events.TypeApprovalRequested || e.Type == events.TypeApprovalResolved || (v != nil && v.Ended())
	s.mu.Unlock()
	if v == nil {
		return
	}
	if needs {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		req, at, err := s.cfg.Client.Requested(ctx, e.RunID)
		cancel()
		if err != nil {
			req = nil // no longer stored, or not readable: the run's events still show
		}
		s.mu.Lock()
		if u := s.idx.ApplyRequest(e.RunID, req, at); u != nil {
			v = u
		}
		s.mu.Unlock()
	}
	s.notify(change{"run", v})
	if approvals {
		s.mu.Lock()
		list := s.idx.Approvals()
		s.mu.Unlock()
		s.notify(change{"approvals", map[string]any{"approvals": list}})
	}
}

// notify sends a change to every follower; a follower too slow to take it
// is dropped (its stream ends, and it reconnects for a fresh snapshot).
func (s *Server) notify(c change) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ch := range s.subs {
		select {
		case ch <- c:
		default:
			delete(s.subs, ch)
			close(ch)
		}
	}
}

// writeJSON writes v with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// errorBody is every error response: {"error": {"code", "message", "details"}}.
type errorBody struct {
	Error *actionbus.Error `json:"error"`
	RunID string           `json:"runId,omitempty"`
}

// writeError writes err with the status of its code.
func writeError(w http.ResponseWriter, err error) {
	e := asError(err)
	writeJSON(w, StatusOf(e.Code), errorBody{Error: e})
}

// asError is err as an *actionbus.Error (internal when it has no code; the
// message is kept, it never holds a secret: the client's errors name
// subjects and ids only).
func asError(err error) *actionbus.Error {
	var e *actionbus.Error
	if errors.As(err, &e) {
		return e
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return actionbus.Errorf(actionbus.CodeTimeout, "%v", err)
	}
	return actionbus.Errorf(actionbus.CodeInternal, "%v", err)
}

// decode reads a JSON body into v, refusing unknown fields and bodies over
// 4 MiB.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return actionbus.Errorf(actionbus.CodePayloadTooLarge, "the request body is over %d bytes", tooLarge.Limit)
		}
		return actionbus.Errorf(actionbus.CodeBadRequest, "the request body is not the documented JSON: %v", err)
	}
	return nil
}

// runID is the {id} of a run path, checked.
func runID(r *http.Request) (string, error) {
	id := r.PathValue("id")
	if !events.ValidRunID(id) {
		return "", actionbus.Errorf(actionbus.CodeInvalidRunID, "%q is not a run id (a canonical ULID)", id)
	}
	return id, nil
}

// listRuns is GET /v1/runs?status=&kind=&user=&limit=.
func (s *Server) listRuns(w http.ResponseWriter, r *http.Request, _ *Token) {
	q := r.URL.Query()
	f := RunFilter{Statuses: list(q.Get("status")), Kinds: list(q.Get("kind")), UserID: q.Get("user"), Limit: 100}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 0 {
			writeError(w, actionbus.Errorf(actionbus.CodeBadRequest, "limit must be a count"))
			return
		}
		f.Limit = n
	}
	s.mu.Lock()
	runs := s.idx.Runs(f)
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"runs": runs})
}

func list(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// startBody is the body of POST /v1/runs: client.RunRequest's fields.
type startBody struct {
	RunID        string             `json:"runId"`
	Prompt       string             `json:"prompt"`
	Scenario     string             `json:"scenario"`
	Action       *events.ActionCall `json:"action"`
	Workflow     map[string]any     `json:"workflow"`
	UserID       string             `json:"userId"`
	AllowedModes []string           `json:"allowedModes"`
	Metadata     map[string]any     `json:"metadata"`
	DeadlineMs   int64              `json:"deadlineMs"`
	Workspace    map[string]string  `json:"workspace"`
	// RetryOf makes the run a retry of the token's user's failed or
	// canceled run (the same request; see client.RunRequest.RetryOf).
	RetryOf string `json:"retryOf"`
}

// resultBody is a run's result as the API returns it.
type resultBody struct {
	RunID     string           `json:"runId"`
	Status    string           `json:"status"`
	Answer    string           `json:"answer,omitempty"`
	Output    any              `json:"output,omitempty"`
	Citations []string         `json:"citations,omitempty"`
	Cycles    int              `json:"cycles,omitempty"`
	Error     *actionbus.Error `json:"error,omitempty"`
	Reason    string           `json:"reason,omitempty"`
	Usage     *client.Usage    `json:"usage,omitempty"`
}

// writeResult writes a run's result: 200 when it completed, the status of
// its error's code when it failed, 409 when it was canceled.
func writeResult(w http.ResponseWriter, res *client.Result) {
	body := resultBody{RunID: res.RunID, Status: res.Status, Answer: res.Answer, Output: res.Output, Citations: res.Citations,
		Cycles: res.Cycles, Error: res.Error, Reason: res.Reason, Usage: res.Usage}
	status := http.StatusOK
	switch res.Status {
	case client.StatusFailed:
		status = StatusOf(res.Error.Code)
	case client.StatusCanceled:
		status = http.StatusConflict
	}
	writeJSON(w, status, body)
}

// startRun is POST /v1/runs[?wait=DURATION]: it starts a run for the
// token's user; with wait, it answers with the result when the run ends
// in time, else 202 like without.
func (s *Server) startRun(w http.ResponseWriter, r *http.Request, tok *Token) {
	var b startBody
	if err := decode(w, r, &b); err != nil {
		writeError(w, err)
		return
	}
	if b.UserID != "" && b.UserID != tok.User {
		writeError(w, actionbus.Errorf(actionbus.CodeForbidden, "a run acts for the token's user %s, not %s", tok.User, b.UserID))
		return
	}
	req := client.RunRequest{RunID: b.RunID, Prompt: b.Prompt, Scenario: b.Scenario,
		AllowedModes: b.AllowedModes, Metadata: b.Metadata, Deadline: time.Duration(b.DeadlineMs) * time.Millisecond, Workspace: b.Workspace,
		RetryOf: b.RetryOf}
	if b.Workflow != nil {
		// Sent as it is: the dispatcher checks all of it.
		req.WorkflowJSON, _ = json.Marshal(b.Workflow) // decoded from JSON: it encodes
	}
	if b.Action != nil {
		req.Action = &client.ActionCall{Name: b.Action.Name, Args: b.Action.Args, IdempotencyKey: b.Action.IdempotencyKey}
	}
	s.start(w, r, tok, req)
}

// retryRun is POST /v1/runs/{id}/retry[?wait=DURATION]: it starts a retry
// of the token's user's failed or canceled run — its stored request again,
// under a new run id, with retryOf (see client.Client.Retry) — and
// answers as POST /v1/runs does. The dispatcher refuses, retry_refused, a
// run that is not the user's, has not failed, or was retried already.
func (s *Server) retryRun(w http.ResponseWriter, r *http.Request, tok *Token) {
	id, err := runID(r)
	if err != nil {
		writeError(w, err)
		return
	}
	if !s.known(r.Context(), id) {
		writeError(w, actionbus.Errorf(actionbus.CodeRunNotFound, "no run %s in tenant %s", id, s.Tenant()))
		return
	}
	req, err := s.cfg.Client.RetryRequest(r.Context(), id)
	if err != nil {
		writeError(w, err)
		return
	}
	s.start(w, r, tok, req)
}

// start starts req for the token's user, signed by the gateway's key
// (?wait as POST /v1/runs).
func (s *Server) start(w http.ResponseWriter, r *http.Request, tok *Token, req client.RunRequest) {
	var wait time.Duration
	if v := r.URL.Query().Get("wait"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			writeError(w, actionbus.Errorf(actionbus.CodeBadRequest, "wait must be a duration such as 30s"))
			return
		}
		wait = min(d, s.cfg.MaxWait)
	}
	req.UserID = tok.User
	req.Principal = tok.Principal(s.cfg.ApprovalKeyID, s.cfg.ApprovalKey)
	if req.RunID == "" {
		req.RunID = events.NewID()
	}
	accepted := func() {
		w.Header().Set("Location", "/v1/runs/"+req.RunID)
		writeJSON(w, http.StatusAccepted, map[string]string{"runId": req.RunID, "status": StatusRunning})
	}
	if wait == 0 {
		if _, err := s.cfg.Client.Start(r.Context(), req); err != nil {
			writeError(w, err)
			return
		}
		accepted()
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), wait)
	defer cancel()
	res, err := s.cfg.Client.Run(ctx, req, nil)
	switch {
	case err == nil:
		writeResult(w, res)
	case errors.Is(err, context.DeadlineExceeded) && r.Context().Err() == nil:
		accepted() // started, not ended yet
	default:
		writeError(w, err)
	}
}

// known reports whether a run exists in the tenant: in the index, or with
// a stored request (a run older than the index).
func (s *Server) known(ctx context.Context, id string) bool {
	s.mu.Lock()
	_, ok := s.idx.Run(id)
	s.mu.Unlock()
	if ok {
		return true
	}
	_, _, err := s.cfg.Client.Requested(ctx, id)
	return err == nil
}

// getRun is GET /v1/runs/{id}.
func (s *Server) getRun(w http.ResponseWriter, r *http.Request, _ *Token) {
	id, err := runID(r)
	if err != nil {
		writeError(w, err)
		return
	}
	s.mu.Lock()
	v, ok := s.idx.Run(id)
	pending := ok && s.idx.NeedsRequest(id)
	s.mu.Unlock()
	if ok && pending {
		// The index has the run's events but not yet its request (being
		// read as the run's first event is applied): read it here, so
		// that the view names the run's user and kind now.
		if req, at, err := s.cfg.Client.Requested(r.Context(), id); err == nil && req != nil {
			v.setRequest(req, at)
		}
	}
	if ok {
		writeJSON(w, http.StatusOK, v)
		return
	}
	// Not in the index (older than what it keeps): from the stream.
	req, at, err := s.cfg.Client.Requested(r.Context(), id)
	if err != nil {
		writeError(w, actionbus.Errorf(actionbus.CodeRunNotFound, "no run %s in tenant %s", id, s.Tenant()))
		return
	}
	x := NewIndex(s.Tenant(), 1)
	x.Apply(client.Event{RunID: id, Type: events.TypeRunStarted, Time: at, Data: json.RawMessage(`{}`)})
	x.ApplyRequest(id, req, at)
	if res, err := s.cfg.Client.Ended(r.Context(), id); err == nil && res != nil {
		x.Apply(resultEvent(res))
	}
	v, _ = x.Run(id)
	writeJSON(w, http.StatusOK, v)
}

// resultEvent is a result as the terminal event the index applies.
func resultEvent(res *client.Result) client.Event {
	e := client.Event{RunID: res.RunID}
	var data any
	switch res.Status {
	case client.StatusCompleted:
		e.Type, data = events.TypeRunCompleted, events.RunCompleted{RunID: res.RunID, Answer: res.Answer, Output: res.Output, Citations: res.Citations, Cycles: res.Cycles, Usage: res.Usage}
	case client.StatusFailed:
		e.Type, data = events.TypeRunFailed, events.RunFailed{RunID: res.RunID, Error: *res.Error, Cycles: res.Cycles, Usage: res.Usage}
	default:
		e.Type, data = events.TypeRunCanceled, events.RunCanceled{RunID: res.RunID, Reason: res.Reason, Cycles: res.Cycles, Usage: res.Usage}
	}
	e.Data, _ = json.Marshal(data)
	return e
}

// runEvents is GET /v1/runs/{id}/events: the run's events as server-sent
// events (event: the type without "io.actionbus.", data: the event), from
// its first stored one to its end, then "end" with the result.
func (s *Server) runEvents(w http.ResponseWriter, r *http.Request, _ *Token) {
	id, err := runID(r)
	if err != nil {
		writeError(w, err)
		return
	}
	if !s.known(r.Context(), id) {
		writeError(w, actionbus.Errorf(actionbus.CodeRunNotFound, "no run %s in tenant %s", id, s.Tenant()))
		return
	}
	out, ok := startSSE(w)
	if !ok {
		writeError(w, errors.New("streaming unsupported"))
		return
	}
	res, err := s.cfg.Client.Follow(r.Context(), id, func(e client.Event) {
		_ = out.send(strings.TrimPrefix(e.Type, "io.actionbus."),
			eventView{ID: e.ID, Type: e.Type, Subject: e.Subject, Time: e.Time, RunID: e.RunID, Data: e.Data})
	})
	if err != nil {
		if r.Context().Err() == nil {
			_ = out.send("error", errorBody{Error: asError(err)})
		}
		return
	}
	_ = out.send("end", resultBody{RunID: res.RunID, Status: res.Status, Answer: res.Answer, Output: res.Output,
		Citations: res.Citations, Cycles: res.Cycles, Error: res.Error, Reason: res.Reason})
}

// eventView is one event of GET /v1/runs/{id}/events.
type eventView struct {
	ID      string          `json:"id"`
	Type    string          `json:"type"`
	Subject string          `json:"subject"`
	Time    time.Time       `json:"time"`
	RunID   string          `json:"runId"`
	Data    json.RawMessage `json:"data"`
}

// runAudit is GET /v1/runs/{id}/audit: the run's audit records and the
// verification of their chain.
func (s *Server) runAudit(w http.ResponseWriter, r *http.Request, _ *Token) {
	id, err := runID(r)
	if err != nil {
		writeError(w, err)
		return
	}
	recs, err := s.cfg.Client.AuditRecords(r.Context(), id)
	if err != nil {
		writeError(w, err)
		return
	}
	if len(recs) == 0 && !s.known(r.Context(), id) {
		writeError(w, actionbus.Errorf(actionbus.CodeRunNotFound, "no run %s in tenant %s", id, s.Tenant()))
		return
	}
	broken := audit.Verify(recs)
	writeJSON(w, http.StatusOK, map[string]any{
		"runId": id, "records": recs, "verified": broken < 0, "brokenAt": broken, "complete": audit.HasTerminal(recs),
	})
}

// cancelRun is POST /v1/runs/{id}/cancel {"reason"}.
func (s *Server) cancelRun(w http.ResponseWriter, r *http.Request, tok *Token) {
	var b struct {
		Reason string `json:"reason"`
	}
	s.answerRun(w, r, &b, func(ctx context.Context, id string) error {
		return s.cfg.Client.Cancel(ctx, id, b.Reason)
	})
}

// inputRun is POST /v1/runs/{id}/input {"answer"}: answers a clarify.
func (s *Server) inputRun(w http.ResponseWriter, r *http.Request, _ *Token) {
	var b struct {
		Answer string `json:"answer"`
	}
	s.answerRun(w, r, &b, func(ctx context.Context, id string) error {
		return s.cfg.Client.Input(ctx, id, b.Answer)
	})
}

// answerRun decodes body, checks the run is the tenant's and publishes.
func (s *Server) answerRun(w http.ResponseWriter, r *http.Request, body any, publish func(context.Context, string) error) {
	id, err := runID(r)
	if err == nil {
		err = decode(w, r, body)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	if !s.known(r.Context(), id) {
		writeError(w, actionbus.Errorf(actionbus.CodeRunNotFound, "no run %s in tenant %s", id, s.Tenant()))
		return
	}
	if err := publish(r.Context(), id); err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]string{"runId": id})
}

// listApprovals is GET /v1/approvals: every pending approval, oldest first.
func (s *Server) listApprovals(w http.ResponseWriter, _ *http.Request, _ *Token) {
	s.mu.Lock()
	list := s.idx.Approvals()
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"approvals": list})
}

// approve is POST /v1/approvals/{id}/approve: signs the approval context
// with the server's key as the token's user and waits for the
// dispatcher's answer.
func (s *Server) approve(w http.ResponseWriter, r *http.Request, tok *Token) {
	if len(s.cfg.ApprovalKey) == 0 {
		writeError(w, actionbus.Errorf(actionbus.CodeForbidden, "this server holds no approval key"))
		return
	}
	s.answerApproval(w, r, func(ctx context.Context, id string) error {
		return s.cfg.Approver.ApproveAs(ctx, id, s.cfg.ApprovalKeyID, s.cfg.ApprovalKey, tok.User)
	})
}

// deny is POST /v1/approvals/{id}/deny {"reason"}.
func (s *Server) deny(w http.ResponseWriter, r *http.Request, tok *Token) {
	var b struct {
		Reason string `json:"reason"`
	}
	if r.ContentLength != 0 {
		if err := decode(w, r, &b); err != nil {
			writeError(w, err)
			return
		}
	}
	if len(s.cfg.ApprovalKey) == 0 {
		writeError(w, actionbus.Errorf(actionbus.CodeForbidden, "this server holds no approval key"))
		return
	}
	s.answerApproval(w, r, func(ctx context.Context, id string) error {
		return s.cfg.Approver.DenyAs(ctx, id, s.cfg.ApprovalKeyID, s.cfg.ApprovalKey, tok.User, b.Reason)
	})
}

// answerApproval answers a pending approval of the tenant's and waits for
// the dispatcher's verdict: 200 when it took effect, the status of the
// refusal's code otherwise.
func (s *Server) answerApproval(w http.ResponseWriter, r *http.Request, answer func(context.Context, string) error) {
	if s.cfg.Approver == nil {
		writeError(w, actionbus.Errorf(actionbus.CodeForbidden, "this server has no approver connection"))
		return
	}
	id := r.PathValue("id")
	s.mu.Lock()
	_, pending := s.idx.Approval(id)
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.MaxWait)
	defer cancel()
	if !pending {
		// The index may lag a just-requested approval: ask the stream.
		if _, err := s.cfg.Approver.Approval(ctx, id); err != nil {
			writeError(w, actionbus.Errorf(actionbus.CodeApprovalNotFound, "no pending approval %s in tenant %s", id, s.Tenant()))
			return
		}
	}
	if err := answer(ctx, id); err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"approvalId": id, "status": "answered"})
}

// catalog is GET /v1/catalog: the actions with their schemas.
func (s *Server) catalog(w http.ResponseWriter, r *http.Request, _ *Token) {
	list, err := s.cfg.Client.Actions(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	out := make([]actionView, 0, len(list))
	for _, a := range list {
		out = append(out, actionView{Name: a.Name, Description: a.Description, Mode: a.Mode, Tier: a.Tier, Pool: a.Pool,
			Version: a.Version, InputSchema: a.InputSchema, OutputSchema: a.OutputSchema, PlannerVisible: a.PlannerVisible,
			Tags: a.Tags, ResourceType: a.ResourceType, RiskLevel: a.RiskLevel})
	}
	writeJSON(w, http.StatusOK, map[string]any{"actions": out})
}

// actionView is one action of GET /v1/catalog.
type actionView struct {
	Name           string          `json:"name"`
	Description    string          `json:"description,omitempty"`
	Mode           string          `json:"mode"`
	Tier           int             `json:"tier"`
	Pool           string          `json:"pool"`
	Version        string          `json:"version,omitempty"`
	InputSchema    json.RawMessage `json:"inputSchema,omitempty"`
	OutputSchema   json.RawMessage `json:"outputSchema,omitempty"`
	PlannerVisible bool            `json:"plannerVisible"`
	Tags           []string        `json:"tags,omitempty"`
	ResourceType   string          `json:"resourceType,omitempty"`
	RiskLevel      string          `json:"riskLevel,omitempty"`
}

// followIndex is GET /v1/events: server-sent events of the index: a
// "snapshot" (runs and approvals), then "run" for each changed run and
// "approvals" whenever the pending approvals change.
func (s *Server) followIndex(w http.ResponseWriter, r *http.Request, _ *Token) {
	out, ok := startSSE(w)
	if !ok {
		writeError(w, errors.New("streaming unsupported"))
		return
	}
	ch := make(chan change, 256)
	s.mu.Lock()
	snapshot := map[string]any{"runs": s.idx.Runs(RunFilter{Limit: 200}), "approvals": s.idx.Approvals()}
	s.subs[ch] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		if _, ok := s.subs[ch]; ok {
			delete(s.subs, ch)
			close(ch)
		}
		s.mu.Unlock()
	}()
	if out.send("snapshot", snapshot) != nil {
		return
	}
	keepalive := time.NewTicker(15 * time.Second)
	defer keepalive.Stop()
	for {
		select {
		case c, ok := <-ch:
			if !ok {
				return // too slow: the caller reconnects for a snapshot
			}
			if out.send(c.event, c.data) != nil {
				return
			}
		case <-keepalive.C:
			if out.comment("keepalive") != nil {
				return
			}
		case <-r.Context().Done():
			return
		}
	}
}

// sse writes server-sent events.
type sse struct {
	w http.ResponseWriter
	f http.Flusher
}

func startSSE(w http.ResponseWriter) (*sse, bool) {
	f, ok := w.(http.Flusher)
	if !ok {
		return nil, false
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	f.Flush()
	return &sse{w: w, f: f}, true
}

func (s *sse) send(event string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(s.w, "event: %s\ndata: %s\n\n", event, data); err != nil {
		return err
	}
	s.f.Flush()
	return nil
}

func (s *sse) comment(text string) error {
	if _, err := fmt.Fprintf(s.w, ": %s\n\n", text); err != nil {
		return err
	}
	s.f.Flush()
	return nil
}
