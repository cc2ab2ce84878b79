package readapi

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/artifacts"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/skills"
)

// ServiceName is the micro service name of the read service, and
// QueueGroup the queue group every instance answers in.
const (
	ServiceName = "actionbus-read"
	QueueGroup  = "actionbus-read"
	// Version is the read service's version (the micro service's).
	Version = "1.0.0"
)

// Defaults of [Config].
const (
	DefaultConcurrency = 32
	DefaultReadTimeout = 10 * time.Second
)

// Lister is the action catalog the read service lists (the dispatcher's
// live view of the catalog bucket).
type Lister interface {
	List() []actions.Entry
}

// catchingUp is a Lister that can wait until it holds every write stored
// so far (actions.View), so that an action the registrar acknowledged is
// listed at once.
type catchingUp interface {
	CatchUp(ctx context.Context)
}

// Config configures a [Service].
type Config struct {
	// Prefix is the subject prefix; default "ab".
	Prefix string
	// Catalog lists the actions; required.
	Catalog Lister
	// Concurrency bounds the reads served at once; default 32. Requests
	// beyond it wait in the subscription's pending buffer.
	Concurrency int
	// ReadTimeout bounds the JetStream reads of one request; default 10 s.
	ReadTimeout time.Duration
	// Logger receives the service's logs; nil discards them.
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	if c.Prefix == "" {
		c.Prefix = events.DefaultPrefix
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.ReadTimeout == 0 {
		c.ReadTimeout = DefaultReadTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate reports configuration errors.
func (c *Config) Validate() error {
	if c.Catalog == nil {
		return errors.New("readapi: Catalog is required")
	}
	if c.Concurrency < 1 || c.ReadTimeout <= 0 {
		return errors.New("readapi: Concurrency and ReadTimeout must be positive")
	}
	return bus.Topology{Prefix: c.Prefix}.Validate()
}

// Service is the read service. Several instances (one per dispatcher)
// share one queue group: each request is answered once.
type Service struct {
	cfg      Config
	nc       *nats.Conn
	js       jetstream.JetStream
	topo     bus.Topology
	subjects events.Subjects
	log      *slog.Logger
	slots    chan struct{}
	wg       sync.WaitGroup
	svc      micro.Service
	stopOnce sync.Once
	mu       sync.Mutex
	stopped  bool
}

// New returns a read service on nc. It serves once started.
func New(nc *nats.Conn, cfg Config) (*Service, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	topo := bus.Topology{Prefix: cfg.Prefix}
	return &Service{cfg: cfg, nc: nc, js: js, topo: topo, subjects: topo.Subjects(), log: cfg.Logger.With("service", "read"),
		slots: make(chan struct{}, cfg.Concurrency)}, nil
}

// Start subscribes to every operation's subject and returns once the
// server has the subscriptions. Call Stop when done.
func (s *Service) Start() error {
	svc, err := micro.AddService(s.nc, micro.Config{Name: ServiceName, Version: Version, QueueGroup: QueueGroup,
		Description: "actionbus read service: a tenant's stored events, audit records, artifacts and catalog"})
	if err != nil {
		return err
	}
	for _, op := range Ops {
		if err := svc.AddEndpoint(op, micro.HandlerFunc(func(req micro.Request) { s.dispatch(op, req) }),
			micro.WithEndpointSubject(s.subjects.AnyAPI(op))); err != nil {
			_ = svc.Stop()
			return err
		}
	}
	s.svc = svc
	return s.nc.Flush()
}

// Stop unsubscribes and waits for the reads in hand to be answered.
func (s *Service) Stop() {
	s.stopOnce.Do(func() {
		s.mu.Lock()
		s.stopped = true
		s.mu.Unlock()
		if s.svc != nil {
			_ = s.svc.Stop()
		}
		s.wg.Wait()
	})
}

// dispatch serves one request on a goroutine of its own, at most
// Concurrency at once.
func (s *Service) dispatch(op string, req micro.Request) {
	if !bus.AnswerableReply(req.Reply()) {
		// The answer would be published as the dispatcher, wherever the
		// requester pointed it: not answered at all.
		return
	}
	s.slots <- struct{}{}
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		<-s.slots
		return // another instance answers the caller's retry
	}
	s.wg.Add(1)
	s.mu.Unlock()
	// The answer is published on the request's reply subject directly, not
	// through req: micro reads what a request answered when its handler
	// returns, which is before this goroutine answers (a data race).
	reply, subject, data := req.Reply(), req.Subject(), req.Data()
	go func() {
		defer func() { <-s.slots; s.wg.Done() }()
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ReadTimeout)
		defer cancel()
		out, err := s.serve(ctx, op, subject, data)
		if err == nil {
			err = s.nc.PublishMsg(&nats.Msg{Subject: reply, Data: out})
			if err == nil {
				return
			}
			err = actionbus.Errorf(actionbus.CodeInternal, "read service: reply: %v", err)
		}
		code, body := errorBody(err)
		if actionbus.CodeOf(err) == actionbus.CodeInternal {
			s.log.Warn("read failed", "op", op, "err", err)
		}
		// The error answer micro's request.Error sends.
		_ = s.nc.PublishMsg(&nats.Msg{Subject: reply, Data: body,
			Header: nats.Header{micro.ErrorHeader: {"read refused"}, micro.ErrorCodeHeader: {code}}})
	}()
}

// serve answers one request: the tenant comes from the subject alone.
func (s *Service) serve(ctx context.Context, op, subject string, body []byte) ([]byte, error) {
	tenant, subjOp, ok := s.subjects.APIFromSubject(subject)
	if !ok || subjOp != op {
		return nil, badRequest("no operation on %q", clip(subject))
	}
	if err := events.CheckTenant(tenant); err != nil {
		return nil, err
	}
	r, err := Decode(op, body)
	if err != nil {
		return nil, err
	}
	budget := r.pageBytes(PageBudget(s.nc.MaxPayload()))
	var out any
	switch op {
	case OpEvents:
		out, err = s.events(ctx, tenant, r, budget)
	case OpApprovals:
		r.Verbs = approvalVerbs
		out, err = s.events(ctx, tenant, r, budget)
	case OpRuns:
		out, err = s.page(ctx, s.topo.StreamRuns(), s.subjects.TenantRuns(tenant), r, budget, func(m stored) bool {
			t, id := s.subjects.RunFromSubject(m.subject)
			return t == tenant && events.ValidRunID(id) && strings.Count(m.subject, ".") == strings.Count(s.subjects.Run(t, id, "v"), ".")
		})
	case OpAudit:
		filter := s.subjects.TenantAudit(tenant)
		if r.Run != "" {
			filter = s.subjects.RunAudit(tenant, r.Run)
		}
		out, err = s.page(ctx, s.topo.StreamAudit(), filter, r, budget, func(m stored) bool {
			t, id := s.auditRun(m.subject)
			return t == tenant && (r.Run == "" || id == r.Run)
		})
	case OpArtifact:
		out, err = s.artifact(ctx, tenant, r, budget)
	case OpCatalog:
		out, err = s.catalog(ctx, tenant, r, budget)
	}
	if err != nil {
		return nil, err
	}
	return json.Marshal(out)
}

// auditRun returns the tenant and run tokens of an audit subject.
func (s *Service) auditRun(subject string) (tenant, runID string) {
	rest, ok := strings.CutPrefix(subject, s.subjects.Prefix()+".audit.")
	if !ok {
		return "", ""
	}
	parts := strings.Split(rest, ".")
	if len(parts) != 3 {
		return "", ""
	}
	return parts[0], parts[1]
}

// events answers an events read: a page of one run's stored events, or
// the last of each verb. Another tenant's run is not found: run ids are
// not namespaced, so only the tenant's own subjects are read, and every
// stored subject is checked to name the tenant and the run.
func (s *Service) events(ctx context.Context, tenant string, r Request, budget int) (Page, error) {
	stream := s.topo.StreamRuns()
	if r.Stream == StreamRequests {
		stream = s.topo.StreamRequests()
	}
	keep := func(m stored) bool {
		t, id := s.subjects.RunFromSubject(m.subject)
		if t != tenant || id != r.Run {
			return false
		}
		if len(r.Verbs) == 0 {
			return true
		}
		for _, v := range r.Verbs {
			if m.subject == s.subjects.Run(tenant, r.Run, v) {
				return true
			}
		}
		return false
	}
	if r.Last {
		var subjects []string
		for _, v := range r.Verbs {
			subjects = append(subjects, s.subjects.StoredForms(tenant, r.Run, v)...)
		}
		it, err := jetstreamext.GetLastMsgsFor(ctx, s.js, stream, subjects)
		if err != nil {
			return Page{}, readErr(err)
		}
		msgs, err := s.collect(it)
		if err != nil {
			return Page{}, err
		}
		sort.Slice(msgs, func(i, j int) bool { return msgs[i].seq < msgs[j].seq })
		for i := range msgs {
			msgs[i].pending = 0
		}
		return fill(msgs, 0, r.limit(), budget, r.HeadersOnly, keep)
	}
	// Every stored event of the run, in both forms a stream may hold (see
	// events.Subjects.StoredForms); keep picks the verbs asked for.
	p, err := s.page(ctx, stream, s.subjects.RunEvents(tenant, r.Run), r, budget, keep)
	if err == nil && r.After == 0 && len(p.Msgs) == 0 && len(r.Verbs) == 0 {
		return Page{}, actionbus.Errorf(actionbus.CodeRunNotFound, "no stored event of run %s in tenant %s", r.Run, tenant).
			WithDetail("runId", r.Run)
	}
	return p, err
}

// page reads a page of stream's messages on filter from the request's
// position.
func (s *Service) page(ctx context.Context, stream, filter string, r Request, budget int, keep func(stored) bool) (Page, error) {
	opts := []jetstreamext.GetBatchOpt{jetstreamext.GetBatchSubject(filter), jetstreamext.GetBatchMaxBytes(budget)}
	if r.Since != nil {
		opts = append(opts, jetstreamext.GetBatchStartTime(*r.Since))
	} else {
		opts = append(opts, jetstreamext.GetBatchSeq(r.After+1))
	}
	n := r.limit()
	if r.Offset > 0 {
		n = 1
	}
	it, err := jetstreamext.GetBatch(ctx, s.js, stream, n, opts...)
	if err != nil {
		return Page{}, readErr(err)
	}
	msgs, err := s.collect(it)
	if err != nil {
		return Page{}, err
	}
	p, err := fill(msgs, r.Offset, r.limit(), budget, r.HeadersOnly, keep)
	if err != nil {
		return Page{}, err
	}
	if len(msgs) == 0 {
		p.Next = r.After
	}
	return p, nil
}

// collect reads a direct get's messages; none is an empty list.
func (s *Service) collect(it func(yield func(*jetstream.RawStreamMsg, error) bool)) ([]stored, error) {
	var out []stored
	// The server's subject, sequence and time, not a publisher's own
	// headers: an executor's message on a run's result subject carrying
	// "Nats-Subject: …completed" was handed to the run's followers as its
	// end.
	for m, err := range bus.AsStored(it) {
		if err != nil {
			return nil, readErr(err)
		}
		out = append(out, s.storedOf(m))
	}
	return out, nil
}

// storedOf is a direct get's message with the server's headers
// (Nats-Stream, Nats-Sequence, ...) taken out, under the subject it was
// published on (a stored run event's partition token dropped).
func (s *Service) storedOf(m *jetstream.RawStreamMsg) stored {
	st := stored{seq: m.Sequence, subject: s.subjects.Canonical(m.Subject), time: m.Time, data: m.Data}
	if np := m.Header.Values("Nats-Num-Pending"); len(np) > 0 {
		st.pending = parseUint(np[len(np)-1]) // the server's: it appends its own
	}
	for k, vs := range m.Header {
		if strings.HasPrefix(k, "Nats-") {
			continue
		}
		if st.header == nil {
			st.header = map[string][]string{}
		}
		st.header[k] = vs
	}
	return st
}

func parseUint(s string) uint64 {
	var n uint64
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + uint64(c-'0')
	}
	return n
}

// readErr is a failed JetStream read as the caller sees it.
func readErr(err error) error {
	var abErr *actionbus.Error
	if errors.As(err, &abErr) {
		return abErr
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) {
		return actionbus.Errorf(actionbus.CodeTimeout, "read service: the stream did not answer in time")
	}
	return actionbus.Errorf(actionbus.CodeInternal, "read service: %v", err)
}

// artifactLoc is where an artifact's chunks are stored.
type artifactLoc struct {
	stream string
	chunks string // the chunks' subject
	info   jetstream.ObjectInfo
}

// findArtifact looks an artifact of tenant up in the services' store and
// every pool's (artifacts.Owned decides ownership: the tenant recorded in
// the object's metadata): artifact_not_found when no store holds one for
// tenant, it was deleted, or two stores hold one under that id (a pool
// cannot shadow another's artifact by planting one under its id). It is
// the one place that knows where artifacts live.
func (s *Service) findArtifact(ctx context.Context, tenant, id string) (artifactLoc, error) {
	notFound := actionbus.Errorf(actionbus.CodeArtifactNotFound, "no artifact %s in tenant %s", id, tenant).WithDetail("artifact", id)
	names := s.js.StreamNames(ctx, jetstream.WithStreamListSubject("$O.*.M.>"))
	var found []artifactLoc
	for stream := range names.Name() {
		bucket, ok := strings.CutPrefix(stream, "OBJ_")
		if !ok || !s.topo.ArtifactStore(bucket) {
			continue
		}
		// The message get, not a direct get: executors write their pools'
		// stores, which therefore answer none (docs/security.md).
		m, err := bus.GetFromLeader(ctx, s.js, stream, bus.LeaderGet{LastFor: "$O." + bucket + ".M." + base64.URLEncoding.EncodeToString([]byte(id))})
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return artifactLoc{}, readErr(err)
		}
		var info jetstream.ObjectInfo
		if json.Unmarshal(m.Data, &info) != nil || info.Deleted || info.Name != id || info.NUID == "" ||
			!artifacts.Owned(info.Metadata, tenant) {
			continue
		}
		found = append(found, artifactLoc{stream: stream, chunks: "$O." + bucket + ".C." + info.NUID, info: info})
	}
	if err := names.Err(); err != nil {
		return artifactLoc{}, readErr(err)
	}
	if len(found) != 1 {
		return artifactLoc{}, notFound
	}
	return found[0], nil
}

// artifact answers an artifact read: the chunks after r.After that fit
// the page.
func (s *Service) artifact(ctx context.Context, tenant string, r Request, budget int) (Chunk, error) {
	loc, err := s.findArtifact(ctx, tenant, r.ID)
	if err != nil {
		return Chunk{}, err
	}
	out := Chunk{Size: int64(loc.info.Size), Digest: loc.info.Digest, MediaType: loc.info.Headers.Get("Content-Type"), Next: r.After}
	if loc.info.Size == 0 {
		out.Done = true
		return out, nil
	}
	overhead := len(`{"size":,"digest":"","mediaType":"","data":"","next":,"done":false}`) + 64 + len(out.Digest) + len(out.MediaType)
	room := (budget - overhead) / 4 * 3
	for cursor := r.After; ; {
		m, err := bus.GetFromLeader(ctx, s.js, loc.stream, bus.LeaderGet{Seq: cursor + 1, NextFor: loc.chunks})
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			if len(out.Data) == 0 {
				return Chunk{}, actionbus.Errorf(actionbus.CodeArtifactNotFound, "artifact %s has no chunk after %d", r.ID, r.After).
					WithDetail("artifact", r.ID)
			}
			out.Done = true
			return out, nil
		}
		if err != nil {
			return Chunk{}, readErr(err)
		}
		if len(out.Data)+len(m.Data) > room {
			if len(out.Data) == 0 {
				return Chunk{}, (&actionbus.Error{Code: actionbus.CodePayloadTooLarge,
					Message: "read service: an artifact chunk is over the page's bytes"}).WithDetail("limit", budget)
			}
			return out, nil
		}
		out.Data = append(out.Data, m.Data...)
		out.Next, cursor = m.Sequence, m.Sequence
	}
}

// catalog answers a catalog read: the actions the tenant may call, or the
// skills, sorted by name, from r.From on.
func (s *Service) catalog(ctx context.Context, tenant string, r Request, budget int) (CatalogPage, error) {
	var names []string
	var docs []any
	switch r.Kind {
	case KindActions:
		if c, ok := s.cfg.Catalog.(catchingUp); ok {
			c.CatchUp(ctx)
		}
		for _, e := range s.cfg.Catalog.List() {
			if e.ServesTenant(tenant) {
				names, docs = append(names, e.Name), append(docs, e)
			}
		}
	case KindSkills:
		found, err := s.skills(ctx, r.Name)
		if err != nil {
			return CatalogPage{}, err
		}
		if r.Name != "" && len(found) == 0 {
			return CatalogPage{}, actionbus.Errorf(actionbus.CodeSkillNotFound, "skill %q is not in the catalog", clip(r.Name)).
				WithDetail("skillName", clip(r.Name))
		}
		for _, sk := range found {
			names, docs = append(names, sk.Name), append(docs, sk)
		}
	}
	out := CatalogPage{}
	size := 64
	for i, doc := range docs {
		if names[i] <= r.From && r.From != "" {
			continue
		}
		b, err := json.Marshal(doc)
		if err != nil {
			return CatalogPage{}, readErr(err)
		}
		if size+len(b)+1 > budget {
			if len(out.Actions)+len(out.Skills) == 0 {
				return CatalogPage{}, (&actionbus.Error{Code: actionbus.CodePayloadTooLarge,
					Message: "read service: a catalog entry is over the page's bytes"}).WithDetail("name", names[i])
			}
			out.More = true
			break
		}
		size += len(b) + 1
		if r.Kind == KindActions {
			out.Actions = append(out.Actions, b)
		} else {
			out.Skills = append(out.Skills, b)
		}
	}
	return out, nil
}

// skills reads the catalog's skills (one when name is set), sorted by
// name then pool, with direct gets of the bucket's last values.
func (s *Service) skills(ctx context.Context, name string) ([]skills.Skill, error) {
	bucket := s.topo.BucketCatalog()
	pattern := "*"
	if name != "" {
		pattern = name
	}
	prefix := "$KV." + bucket + "."
	it, err := jetstreamext.GetLastMsgsFor(ctx, s.js, "KV_"+bucket, []string{prefix + "*." + actions.SkillKeyMarker + "." + pattern})
	if err != nil {
		return nil, readErr(err)
	}
	msgs, err := s.collect(it)
	if err != nil {
		return nil, err
	}
	var out []skills.Skill
	for _, m := range msgs {
		if op := m.header["KV-Operation"]; len(op) > 0 && (op[0] == "DEL" || op[0] == "PURGE") {
			continue
		}
		var sk skills.Skill
		// A value that does not decode, or names another pool or skill
		// than its key, is not a skill this key may hold.
		if json.Unmarshal(m.data, &sk) != nil || prefix+skills.Key(sk.Pool, sk.Name) != m.subject {
			continue
		}
		out = append(out, sk)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Pool < out[j].Pool
	})
	return out, nil
}
