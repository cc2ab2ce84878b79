package bus

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
)

// DefaultPool is the executor pool used when none is named.
const DefaultPool = "default"

// Consumer names. Pool work consumers are named PoolConsumer(pool).
const (
	ConsumerDispatcher         = "dispatcher"
	ConsumerDispatcherRequests = "dispatcher-requests"
	ConsumerDispatcherTimers   = "dispatcher-timers"
	ConsumerPlanner            = "planner"
	ConsumerAuditorRuns        = "auditor-runs"
	ConsumerAuditorRequests    = "auditor-requests"
	ConsumerAuditorWork        = "auditor-work"
	ConsumerAuditorRejected    = "auditor-rejected"
	ConsumerAuditorTimers      = "auditor-timers"
)

// PoolConsumer returns the name of the durable work consumer shared by all
// executors of a pool.
func PoolConsumer(pool string) string { return "pool-" + pool }

// Topology declares every stream, consumer and bucket of one deployment. It
// is the single place where their limits are set; docs/events.md documents
// the same values.
type Topology struct {
	// Prefix is the subject prefix; default [events.DefaultPrefix]. Stream and
	// bucket names are derived from it, so several deployments can share
	// one NATS account.
	Prefix string
	// Pools are the executor pools to provision work consumers for;
	// default [DefaultPool].
	Pools []string
	// Replicas of every stream and bucket; default 1 (3 in deploy/nats).
	Replicas int
	// Placement, when set, places every stream and bucket (a cluster name
	// and/or server tags).
	Placement *jetstream.Placement
	// DuplicateWindow of every stream; default 2 minutes.
	DuplicateWindow time.Duration
	// RunRetention is how long run events are kept; default 7 days.
	RunRetention time.Duration
	// AuditRetention is how long audit records are kept; default 365 days.
	AuditRetention time.Duration
	// AckWait is how long a consumer waits for an ack before redelivering;
	// default 30 seconds. Later redeliveries back off (2×, 4×, 10×).
	AckWait time.Duration
	// IdempotencyTTL is how long results of calls with an idempotency key
	// are kept for replays; default 24 hours.
	IdempotencyTTL time.Duration
	// Partitions is how many partitions the runs are spread over; default
	// (0) what the streams have, else 1; at most [MaxPartitions]. Each run's events are stored under its
	// partition ([events.Subjects.InPartition]: the server's partition()
	// of the run id), and each partition is consumed by one dispatcher at
	// a time, so a run has one owner and more dispatchers, up to
	// Partitions, share the runs. Changing it moves runs in flight to
	// other partitions; lowering it removes consumers, which Provision
	// refuses while they hold events (actionbus.CodeTopologyBusy).
	Partitions int
}

// MaxPartitions bounds [Topology.Partitions]: the dispatcher user's
// permissions name each partition's consumers (a consumer name is one
// subject token, which no wildcard can match a part of).
const MaxPartitions = 32

// Partition consumers: each partition of the runs has its own dispatcher
// consumers, pinned to one dispatcher at a time.
const (
	// OwnerGroup is the priority group every dispatcher pulls the
	// partition consumers in: the server delivers a consumer's messages
	// to the one client it pinned, so two dispatchers never handle one
	// partition at once, even while they disagree on who owns it.
	OwnerGroup = "owner"
	// PinnedTTL is how long a pin outlives its client's last pull (a
	// dispatcher that died without handing its partitions on).
	PinnedTTL = 6 * time.Second
	// PartitionPullExpiry is how long a partition consumer's pull lives:
	// a pinned dispatcher pulls again well within [PinnedTTL].
	PartitionPullExpiry = 2 * time.Second
	// DispatcherPresenceTTL is how long a dispatcher's presence lasts
	// without a refresh: its partitions move to the others after it.
	DispatcherPresenceTTL = 4 * time.Second
)

// PartitionConsumer returns the name of one partition's consumer of a
// dispatcher consumer ([ConsumerDispatcher], [ConsumerDispatcherRequests],
// [ConsumerDispatcherTimers]): "<name>-p<partition>".
func PartitionConsumer(name string, partition int) string {
	return name + "-p" + strconv.Itoa(partition)
}

// DispatcherConsumers are the three dispatcher consumers of a partition,
// each with the stream it reads.
func (t Topology) DispatcherConsumers(partition int) []ConsumerSpec {
	t = t.withDefaults()
	s := t.Subjects()
	in := func(verbs ...string) []string {
		var out []string
		for _, v := range verbs {
			out = append(out, s.InPartition(v, partition))
		}
		return out
	}
	pinned := func(c jetstream.ConsumerConfig) jetstream.ConsumerConfig {
		c.PriorityPolicy, c.PriorityGroups, c.PinnedTTL = jetstream.PriorityPolicyPinned, []string{OwnerGroup}, PinnedTTL
		return c
	}
	p := strconv.Itoa(partition)
	return []ConsumerSpec{
		{t.StreamRuns(), pinned(t.durable(PartitionConsumer(ConsumerDispatcher, partition),
			"dispatcher: decisions, results, synthesis parts of partition "+p, in("decision", "result", "synthesized")...))},
		{t.StreamTimers(), pinned(t.durable(PartitionConsumer(ConsumerDispatcherTimers, partition),
			"dispatcher: fired timers of partition "+p, in(events.TimerVerb)...))},
		{t.StreamRequests(), pinned(t.durable(PartitionConsumer(ConsumerDispatcherRequests, partition),
			"dispatcher: run requests, cancels, inputs, approvals' answers of partition "+p, in("*")...))},
	}
}

// partitionTransform returns the transform that stores the run events of
// verb ("*": any) under their run's partition: source's wildcards are the
// tenant, the run and, for "*", the verb.
func (t Topology) partitionTransform(source, verb string) *jetstream.SubjectTransformConfig {
	s := t.Subjects()
	if verb == "*" {
		verb = "{{wildcard(3)}}"
	}
	return &jetstream.SubjectTransformConfig{Source: source,
		Destination: s.Run("{{wildcard(1)}}", "{{wildcard(2)}}", verb) + ".{{partition(" + strconv.Itoa(t.withDefaults().Partitions) + ",2)}}"}
}

// partitionsRE reads the partition count back from a stream's transform.
var partitionsRE = regexp.MustCompile(`\{\{\s*partition\(\s*(\d+)\s*,`)

// RunPartition returns the partition of the runs, out of partitions, that
// the streams' transform stores run runID's events under: the server's
// partition() of the run id token, FNV-1a (32 bits) modulo the count.
func RunPartition(runID string, partitions int) int {
	if partitions <= 1 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(runID))
	return int(h.Sum32() % uint32(partitions))
}

// PartitionsOf returns the number of partitions a runs, timers or
// requests stream was provisioned with (its subject transform), or an
// error when it stores no partition.
func PartitionsOf(cfg jetstream.StreamConfig) (int, error) {
	if cfg.SubjectTransform != nil {
		if m := partitionsRE.FindStringSubmatch(cfg.SubjectTransform.Destination); m != nil {
			if n, err := strconv.Atoi(m[1]); err == nil && n >= 1 && n <= MaxPartitions {
				return n, nil
			}
		}
	}
	return 0, actionbus.Errorf(actionbus.CodeMissingTopology,
		"stream %s stores no run partition (provisioned by an earlier version): run `actionbus provision` with the services drained", cfg.Name)
}

// DefaultAckWait is the ack wait of every consumer unless configured.
const DefaultAckWait = 30 * time.Second

func (t Topology) withDefaults() Topology {
	if t.Prefix == "" {
		t.Prefix = events.DefaultPrefix
	}
	if len(t.Pools) == 0 {
		t.Pools = []string{DefaultPool}
	}
	if t.Replicas == 0 {
		t.Replicas = 1
	}
	if t.DuplicateWindow == 0 {
		t.DuplicateWindow = 2 * time.Minute
	}
	if t.RunRetention == 0 {
		t.RunRetention = 7 * 24 * time.Hour
	}
	if t.AuditRetention == 0 {
		t.AuditRetention = 365 * 24 * time.Hour
	}
	if t.AckWait == 0 {
		t.AckWait = DefaultAckWait
	}
	if t.IdempotencyTTL == 0 {
		t.IdempotencyTTL = 24 * time.Hour
	}
	if t.Partitions == 0 {
		t.Partitions = 1
	}
	return t
}

// Validate reports an invalid topology.
func (t Topology) Validate() error {
	t = t.withDefaults()
	if _, err := events.NewSubjects(t.Prefix); err != nil {
		return err
	}
	if strings.Contains(t.Prefix, ".") {
		return fmt.Errorf("events: topology prefix %q must be one subject token (stream names derive from it)", t.Prefix)
	}
	for _, p := range t.Pools {
		if !events.ValidPool(p) {
			return fmt.Errorf("events: invalid pool name %q (1 to 64 letters, digits, '_' or '-')", p)
		}
	}
	if t.Replicas < 1 || t.Replicas > 5 {
		return fmt.Errorf("events: replicas must be 1 to 5, got %d", t.Replicas)
	}
	if t.Partitions < 1 || t.Partitions > MaxPartitions {
		return fmt.Errorf("events: partitions must be 1 to %d, got %d", MaxPartitions, t.Partitions)
	}
	return nil
}

func (t Topology) name(kind string) string {
	return strings.ToUpper(t.withDefaults().Prefix) + "_" + kind
}

// StreamRuns is the stream of the per-run events services publish
// (limits retention).
func (t Topology) StreamRuns() string { return t.name("RUNS") }

// StreamRequests is the stream of the per-run events clients and approvers
// publish: run requests, cancels, inputs and approvals' answers. It is
// apart from [Topology.StreamRuns] so that the two trust domains never
// share a duplicate window: nothing a client writes can deduplicate (and
// so suppress) an event a service writes.
func (t Topology) StreamRequests() string { return t.name("REQUESTS") }

// StreamWork is the stream of executor work (limits retention: the
// auditor reads it alongside the pools, and an interest stream can stop
// delivering, or drop, what was published while its consumers' leaders
// moved to another node — nats-io/nats-server#7664 — which lost work in
// the three-node failover test).
func (t Topology) StreamWork() string { return t.name("WORK") }

// StreamTimers is the stream of the runs' timers: the schedules the
// dispatcher arms and the timer.fired events the server writes when they
// fall due (limits retention). It is the only stream that allows message
// schedules, and only the dispatcher publishes into it: a schedule's
// target may be any subject of its stream and the server writes it
// without the publisher's permissions, so a user that could schedule into
// the runs stream could have the server write a dispatcher's event there
// (a forged run.completed), or purge another run's timer.
func (t Topology) StreamTimers() string { return t.name("TIMERS") }

// StreamRejected is the stream of rejected events.
func (t Topology) StreamRejected() string { return t.name("REJECTED") }

// StreamAudit is the long-retention audit stream.
func (t Topology) StreamAudit() string { return t.name("AUDIT") }

// BucketRuns is the key-value bucket of run state (revision-checked).
func (t Topology) BucketRuns() string { return strings.ToLower(t.withDefaults().Prefix) + "_runs" }

// RunStateKey reports whether key of the runs bucket holds a run's state:
// the dispatchers keep a key of their own there (their id secret, which
// only the dispatcher user may read, as run state), named with a leading
// underscore, which no run id has.
func RunStateKey(key string) bool { return !strings.HasPrefix(key, "_") }

// BucketCatalog is the key-value bucket of action definitions. Only the
// registrar (hosted by the dispatchers) writes it, from the executors'
// announcements ([events.Subjects.Announce]).
func (t Topology) BucketCatalog() string {
	return strings.ToLower(t.withDefaults().Prefix) + "_catalog"
}

// BucketCatalogOwners is the key-value bucket of the pool that owns each
// action and skill name ("action.<name>", "skill.<name>" → pool). The
// registrar creates an owner record with a create-if-absent write before it
// records a pool's entry, so exactly one pool owns a name, whichever
// dispatcher registers it.
func (t Topology) BucketCatalogOwners() string {
	return strings.ToLower(t.withDefaults().Prefix) + "_catalog_owners"
}

// perPool names a store that belongs to one pool: "<prefix>_<kind>_<pool>".
// Pool names are letters, digits, '_' and '-' ([Topology.Validate]), so
// the name is a valid bucket name.
func (t Topology) perPool(kind, pool string) string {
	if pool == "" {
		pool = DefaultPool
	}
	return strings.ToLower(t.withDefaults().Prefix) + "_" + kind + "_" + pool
}

// BucketPresence is the key-value bucket of the presence of a pool's
// executors (keys expire): one bucket per pool, so that an executor can
// wipe no other pool's presence.
func (t Topology) BucketPresence(pool string) string { return t.perPool("presence", pool) }

// BucketIdempotency is the key-value bucket of a pool's idempotency keys:
// a reservation while a call runs, then its result. One bucket per pool,
// written only by that pool's executor user; its stream refuses rollups,
// purges and message deletes ([Topology.Provision]), so no executor can
// wipe records, not even its own pool's in one stroke.
func (t Topology) BucketIdempotency(pool string) string { return t.perPool("idempotency", pool) }

// BucketDispatchers is the key-value bucket of the dispatchers'
// presence: each live dispatcher refreshes its key, and every dispatcher
// derives the partitions it owns from the keys there.
func (t Topology) BucketDispatchers() string {
	return strings.ToLower(t.withDefaults().Prefix) + "_dispatchers"
}

// BucketPolicy is the key-value bucket of the reloadable policy document.
func (t Topology) BucketPolicy() string {
	return strings.ToLower(t.withDefaults().Prefix) + "_policy"
}

// BucketLimits is the key-value bucket of concurrency keys and rate
// limits: one revision-checked entry per key (its holders, its token
// bucket, its queue), shared by every dispatcher and written by
// dispatchers only.
func (t Topology) BucketLimits() string {
	return strings.ToLower(t.withDefaults().Prefix) + "_limits"
}

// BucketPlannerLimits is the key-value bucket of the planners' own LLM
// concurrency and rate limits (planner.Config.LLMLimit), apart from the
// dispatchers' [Topology.BucketLimits].
func (t Topology) BucketPlannerLimits() string {
	return strings.ToLower(t.withDefaults().Prefix) + "_planner_limits"
}

// BucketArtifacts is the services' object store: the large outputs the
// dispatcher keeps (workflow step outputs, workspace documents). Executors
// write their artifacts in their pool's store ([Topology.PoolArtifacts]).
func (t Topology) BucketArtifacts() string {
	return strings.ToLower(t.withDefaults().Prefix) + "_artifacts"
}

// PoolArtifacts is the object store of the artifacts a pool's executors
// write (large outputs, files a handler stores); only that pool's
// executor user writes it.
func (t Topology) PoolArtifacts(pool string) string { return t.perPool("artifacts", pool) }

// ArtifactStore reports whether name is one of the topology's artifact
// stores: the services' or a pool's (any valid pool name, provisioned or
// not). A reference naming any other bucket is no artifact.
func (t Topology) ArtifactStore(name string) bool {
	if name == t.BucketArtifacts() {
		return true
	}
	pool, ok := strings.CutPrefix(name, t.BucketArtifacts()+"_")
	return ok && events.ValidPool(pool)
}

// PresenceTTL is how long an executor's presence lasts without a refresh.
const PresenceTTL = 15 * time.Second

// Subjects returns the subjects of the topology's prefix.
func (t Topology) Subjects() events.Subjects { return events.MustSubjects(t.withDefaults().Prefix) }

// IngestedTransform is the requests stream's subject transform: an event
// the ingress writes on [events.Subjects.Ingested] is stored under [events.Subjects.Run]
// of the same tenant, run and verb, in the run's partition.
func (t Topology) IngestedTransform() *jetstream.SubjectTransformConfig {
	s := t.Subjects()
	return t.partitionTransform(s.Ingested("*", "*", "*"), "*")
}

// Streams returns the stream configurations.
func (t Topology) Streams() []jetstream.StreamConfig {
	t = t.withDefaults()
	s := t.Subjects()
	base := func(name, desc string, subjects []string) jetstream.StreamConfig {
		return jetstream.StreamConfig{
			Name:        name,
			Description: desc,
			Subjects:    subjects,
			Storage:     jetstream.FileStorage,
			Replicas:    t.Replicas,
			Placement:   t.Placement,
			Duplicates:  t.DuplicateWindow,
			Discard:     jetstream.DiscardOld,
		}
	}
	runs := base(t.StreamRuns(), "actionbus per-run events of services, and the partitions' fences",
		append(s.ServiceRunSubjects(), s.Fences()))
	runs.SubjectTransform = t.partitionTransform(s.AnyRun("*"), "*")
	runs.Retention = jetstream.LimitsPolicy
	runs.MaxAge = t.RunRetention
	// Direct gets name the subject in the API subject
	// ($JS.API.DIRECT.GET.<stream>.<subject>), so NATS permissions can
	// confine a tenant's reads of last messages to its own subjects (a
	// STREAM.MSG.GET request carries the subject, or a sequence, in its
	// body, where no permission reaches).
	runs.AllowDirect = true

	timers := base(t.StreamTimers(), "actionbus timers of runs (the dispatcher's schedules, fired timers)", s.TimerSubjects())
	timers.Retention = jetstream.LimitsPolicy
	timers.MaxAge = t.RunRetention
	timers.AllowMsgSchedules = true
	// A run's log (its fired timers among it) is read with direct gets,
	// which the dispatcher user may make (no consumer of its own).
	timers.AllowDirect = true
	// The fired timers are stored under their partition; the schedules,
	// one token longer, are not transformed.
	timers.SubjectTransform = t.partitionTransform(s.AnyRun(events.TimerVerb), events.TimerVerb)

	// Only the ingress writes the requests stream, under subjects no
	// tenant imports; the transform stores each event under its run
	// subject, which every reader filters on.
	requests := base(t.StreamRequests(), "actionbus per-run events of clients and approvers (written by the ingress)", s.IngestedSubjects())
	requests.SubjectTransform = t.IngestedTransform()
	requests.Retention = jetstream.LimitsPolicy
	requests.MaxAge = t.RunRetention
	requests.AllowDirect = true

	work := base(t.StreamWork(), "actionbus executor work", []string{s.AllPools()})
	work.Retention = jetstream.LimitsPolicy
	work.MaxAge = t.RunRetention

	rejected := base(t.StreamRejected(), "actionbus rejected events", []string{s.AllRejected()})
	rejected.Retention = jetstream.LimitsPolicy
	rejected.MaxAge = t.RunRetention

	audit := base(t.StreamAudit(), "actionbus audit records", []string{s.AllAudit()})
	audit.Retention = jetstream.LimitsPolicy
	audit.MaxAge = t.AuditRetention
	// The read service pages a tenant's audit records with direct gets
	// (no consumer per read).
	audit.AllowDirect = true
	return []jetstream.StreamConfig{runs, timers, requests, work, rejected, audit}
}

// ConsumerSpec is a durable consumer and the stream it reads.
type ConsumerSpec struct {
	Stream string
	Config jetstream.ConsumerConfig
}

const (
	// DefaultMaxDeliver bounds the deliveries of one action request (the
	// pools' work consumers): an executor answers the last one with
	// delivery_exhausted instead of running the action again.
	DefaultMaxDeliver = 5
	// HandlerMaxDeliver bounds the deliveries of one event to the
	// services' own consumers (dispatcher, planner, auditor). Their
	// handlers are idempotent and nak a transient failure (a stream
	// leader being elected, a server going away) with a delay of 100 ms
	// doubling to 30 s: 20 deliveries keep an event for about six minutes
	// of failures. At 5 the naks spanned 1.5 s, shorter than a failover,
	// and the server then dropped the event.
	HandlerMaxDeliver = 20
	// DefaultMaxAckPending caps in-flight messages of one consumer.
	DefaultMaxAckPending = 1000
	// AuditorMaxAckPending caps the auditor's in-flight messages per
	// consumer: events wait unacknowledged while their records are
	// batched (audit.Config.FlushAfter), so at 1 000 a busy system would
	// stall the auditor's pulls.
	AuditorMaxAckPending = 20000
)

func (t Topology) durable(name, desc string, filters ...string) jetstream.ConsumerConfig {
	// No BackOff: handlers' own retries are naks with a delay, and a
	// server with a BackOff list offsets a nak's delay by the list's entry
	// for the delivery count (a 200 ms nak of a second delivery waited
	// 30 s). Crashed handlers are redelivered after AckWait.
	return jetstream.ConsumerConfig{
		Durable:        name,
		Description:    desc,
		FilterSubjects: filters,
		AckPolicy:      jetstream.AckExplicitPolicy,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		AckWait:        t.withDefaults().AckWait,
		MaxDeliver:     HandlerMaxDeliver,
		MaxAckPending:  DefaultMaxAckPending,
	}
}

// leaderReads turns off direct gets on a stream, so that reads are served
// by its leader.
func (t Topology) leaderReads(ctx context.Context, js jetstream.JetStream, stream string) error {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("events: provision %s: %w", stream, err)
	}
	cfg := st.CachedInfo().Config
	if !cfg.AllowDirect {
		return nil
	}
	cfg.AllowDirect = false
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("events: provision %s: %w", stream, err)
	}
	return nil
}

// work sets what a pool's work consumer needs beyond the defaults.
func work(c jetstream.ConsumerConfig) jetstream.ConsumerConfig {
	c.MaxDeliver = DefaultMaxDeliver
	return c
}

// auditor sets what the auditor's consumers need beyond the defaults:
// the auditor acknowledges the last event of each run of events whose
// records are stored, which acknowledges every event before it (AckPolicy
// all), instead of each event.
func auditor(c jetstream.ConsumerConfig) jetstream.ConsumerConfig {
	c.MaxAckPending = AuditorMaxAckPending
	c.AckPolicy = jetstream.AckAllPolicy
	return c
}

// MetaDeliveredBefore is the metadata key of a consumer that replaced
// another one (see [Topology.Provision]): the last stream sequence the
// replaced consumer had delivered. The messages up to it are delivered
// again from the replaced consumer's ack floor, and some of them were
// handled already.
const MetaDeliveredBefore = "actionbus.delivered-before"

// consumerChange decides how provisioning brings an existing consumer
// (have) to its declared configuration (want): the configuration to
// write, and whether the consumer must be deleted and created again
// (the server cannot change a consumer's ack policy in place). A replaced
// consumer starts after the old one's ack floor, so that nothing it did
// not acknowledge is skipped and nothing it did is delivered again but
// what it had delivered past its floor, which [MetaDeliveredBefore]
// names. A consumer that was replaced keeps its start and that
// metadata on later updates.
func consumerChange(have *jetstream.ConsumerInfo, want jetstream.ConsumerConfig) (cfg jetstream.ConsumerConfig, replace bool) {
	cfg = want
	if have.Config.AckPolicy != want.AckPolicy {
		if have.Delivered.Stream == 0 {
			return cfg, true
		}
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, have.AckFloor.Stream+1
		if have.Delivered.Stream > have.AckFloor.Stream {
			cfg.Metadata = map[string]string{MetaDeliveredBefore: strconv.FormatUint(have.Delivered.Stream, 10)}
		}
		return cfg, true
	}
	if have.Config.DeliverPolicy == jetstream.DeliverByStartSequencePolicy && want.DeliverPolicy == jetstream.DeliverAllPolicy {
		cfg.DeliverPolicy, cfg.OptStartSeq = have.Config.DeliverPolicy, have.Config.OptStartSeq
		if v, ok := have.Config.Metadata[MetaDeliveredBefore]; ok {
			cfg.Metadata = map[string]string{MetaDeliveredBefore: v}
		}
	}
	return cfg, false
}

// provisionConsumer creates or updates one consumer, replacing it when
// [consumerChange] says so.
func (t Topology) provisionConsumer(ctx context.Context, js jetstream.JetStream, cs ConsumerSpec) error {
	cfg := cs.Config
	cons, err := js.Consumer(ctx, cs.Stream, cs.Config.Durable)
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound):
	case err != nil:
		return fmt.Errorf("events: provision consumer %s on %s: %w", cs.Config.Durable, cs.Stream, err)
	default:
		var replace bool
		if cfg, replace = consumerChange(cons.CachedInfo(), cs.Config); replace {
			if err := js.DeleteConsumer(ctx, cs.Stream, cs.Config.Durable); err != nil {
				return fmt.Errorf("events: provision consumer %s on %s: replace: %w", cs.Config.Durable, cs.Stream, err)
			}
		}
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, cs.Stream, cfg); err != nil {
		return fmt.Errorf("events: provision consumer %s on %s: %w", cs.Config.Durable, cs.Stream, err)
	}
	return nil
}

// AuditSinks are the sinks the auditor can copy the audit stream into
// (audit.Sink's names): each reads with a durable consumer of its own,
// [SinkConsumer], which [Topology.Provision] creates so that the auditor
// creates no consumer (its user may not).
var AuditSinks = []string{"jsonl", "sqlite"}

// SinkConsumer is the durable consumer of the audit sink named sink.
func SinkConsumer(sink string) string { return "sink-" + sink }

// sinkConsumer is the consumer of an audit sink: one record message at a
// time, acknowledged once written and synced; a sink that crashed
// mid-write has it again within 10 s at most.
func (t Topology) sinkConsumer(sink string) ConsumerSpec {
	ackWait := t.AckWait
	if ackWait == 0 || ackWait > 10*time.Second {
		ackWait = 10 * time.Second
	}
	return ConsumerSpec{t.StreamAudit(), jetstream.ConsumerConfig{
		Durable: SinkConsumer(sink), Description: "audit sink " + sink, FilterSubject: t.Subjects().AllAudit(),
		AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverAllPolicy,
		MaxDeliver: -1, MaxAckPending: 1, AckWait: ackWait,
	}}
}

// Consumers returns the durable consumers.
func (t Topology) Consumers() []ConsumerSpec {
	t = t.withDefaults()
	s := t.Subjects()
	out := []ConsumerSpec{
		// Each filter in both stored forms: under a partition, and as a
		// release before partitions stored it (what it left unhandled is
		// still planned and audited after an upgrade).
		{t.StreamRuns(), t.durable(ConsumerPlanner, "planner: decision and synthesis requests",
			s.AnyRun("decide"), s.StoredAnyRun("decide"), s.AnyRun("synthesize"), s.StoredAnyRun("synthesize"))},
		{t.StreamRuns(), auditor(t.durable(ConsumerAuditorRuns, "auditor: every per-run event of services but timers", s.AnyRun("*"), s.StoredAnyRun("*")))},
		{t.StreamTimers(), auditor(t.durable(ConsumerAuditorTimers, "auditor: every fired timer (not the schedules)",
			s.AnyRun(events.TimerVerb), s.StoredAnyRun(events.TimerVerb)))},
		{t.StreamRequests(), auditor(t.durable(ConsumerAuditorRequests, "auditor: every per-run event of clients and approvers", s.AnyRun("*"), s.StoredAnyRun("*")))},
		{t.StreamWork(), auditor(t.durable(ConsumerAuditorWork, "auditor: every action request", s.AllPools()))},
		{t.StreamRejected(), auditor(t.durable(ConsumerAuditorRejected, "auditor: every rejected event", s.AllRejected()))},
	}
	for _, sink := range AuditSinks {
		out = append(out, t.sinkConsumer(sink))
	}
	for _, p := range t.Pools {
		out = append(out, ConsumerSpec{t.StreamWork(), work(t.durable(PoolConsumer(p), "executors of pool "+p, s.PoolRequest(p)))})
	}
	for p := range t.Partitions {
		out = append(out, t.DispatcherConsumers(p)...)
	}
	return out
}

// Buckets returns the key-value bucket configurations.
func (t Topology) Buckets() []jetstream.KeyValueConfig {
	t = t.withDefaults()
	out := []jetstream.KeyValueConfig{
		{Bucket: t.BucketRuns(), Description: "actionbus run state (revision-checked)", History: 1, Storage: jetstream.FileStorage, Replicas: t.Replicas, TTL: t.RunRetention, Placement: t.Placement},
		{Bucket: t.BucketCatalog(), Description: "actionbus action catalog (written by the registrar)", History: 5, Storage: jetstream.FileStorage, Replicas: t.Replicas, Placement: t.Placement},
		{Bucket: t.BucketCatalogOwners(), Description: "actionbus owner pool of each action and skill name (written by the registrar)", History: 1, Storage: jetstream.FileStorage, Replicas: t.Replicas, Placement: t.Placement},
		{Bucket: t.BucketPolicy(), Description: "actionbus policy document (reloaded without restart)", History: 10, Storage: jetstream.FileStorage, Replicas: t.Replicas, Placement: t.Placement},
		// A key's entry lives a day past its last change: a key nobody
		// uses any more holds nothing worth keeping.
		{Bucket: t.BucketLimits(), Description: "actionbus concurrency keys and rate limits (dispatchers)", History: 1, Storage: jetstream.FileStorage, Replicas: t.Replicas, TTL: 24 * time.Hour, Placement: t.Placement},
		{Bucket: t.BucketPlannerLimits(), Description: "actionbus planners' LLM concurrency and rate limits", History: 1, Storage: jetstream.FileStorage, Replicas: t.Replicas, TTL: 24 * time.Hour, Placement: t.Placement},
		// An expired presence leaves a delete marker, which the other
		// dispatchers' watches see.
		{Bucket: t.BucketDispatchers(), Description: "actionbus presence of the dispatchers (keys expire)", History: 1, Storage: jetstream.FileStorage,
			Replicas: t.Replicas, TTL: DispatcherPresenceTTL, LimitMarkerTTL: DispatcherPresenceTTL, Placement: t.Placement},
	}
	for _, p := range t.Pools {
		out = append(out,
			jetstream.KeyValueConfig{Bucket: t.BucketPresence(p), Description: "actionbus presence of pool " + p + "'s executors", History: 1, Storage: jetstream.FileStorage, Replicas: t.Replicas, TTL: PresenceTTL, Placement: t.Placement},
			jetstream.KeyValueConfig{Bucket: t.BucketIdempotency(p), Description: "actionbus idempotency keys and results of pool " + p, History: 1, Storage: jetstream.FileStorage, Replicas: t.Replicas, TTL: t.IdempotencyTTL, Placement: t.Placement},
		)
	}
	return out
}

// ObjectStores returns the object store configurations: the services'
// store and one per pool.
func (t Topology) ObjectStores() []jetstream.ObjectStoreConfig {
	t = t.withDefaults()
	out := []jetstream.ObjectStoreConfig{
		{Bucket: t.BucketArtifacts(), Description: "actionbus large outputs the dispatcher keeps", Storage: jetstream.FileStorage, Replicas: t.Replicas, TTL: t.RunRetention, Placement: t.Placement},
	}
	for _, p := range t.Pools {
		out = append(out, jetstream.ObjectStoreConfig{Bucket: t.PoolArtifacts(p), Description: "actionbus artifacts of pool " + p + "'s executors",
			Storage: jetstream.FileStorage, Replicas: t.Replicas, TTL: t.RunRetention, Placement: t.Placement})
	}
	return out
}

// idempotencyBucket reports whether bucket is one of the pools'
// idempotency buckets.
func (t Topology) idempotencyBucket(bucket string) bool {
	for _, p := range t.Pools {
		if bucket == t.BucketIdempotency(p) {
			return true
		}
	}
	return false
}

// provisionSealed creates a sealed bucket (an idempotency bucket) when it
// does not exist, or updates its stream's age, replicas and placement
// when it does, keeping it sealed.
func (t Topology) provisionSealed(ctx context.Context, js jetstream.JetStream, kc jetstream.KeyValueConfig) error {
	st, err := js.Stream(ctx, "KV_"+kc.Bucket)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		if _, err := js.CreateKeyValue(ctx, kc); err != nil {
			return fmt.Errorf("events: provision bucket %s: %w", kc.Bucket, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("events: provision bucket %s: %w", kc.Bucket, err)
	}
	cfg := st.CachedInfo().Config
	if cfg.MaxAge == kc.TTL && cfg.Replicas == kc.Replicas && cfg.DenyPurge && !cfg.AllowRollup && cfg.DenyDelete &&
		(kc.Placement == nil || cfg.Placement != nil && cfg.Placement.Cluster == kc.Placement.Cluster) {
		return nil
	}
	cfg.MaxAge, cfg.Replicas = kc.TTL, kc.Replicas
	if kc.Placement != nil {
		cfg.Placement = kc.Placement
	}
	cfg.AllowRollup, cfg.DenyDelete, cfg.DenyPurge = false, true, true
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("events: provision bucket %s: %w", kc.Bucket, err)
	}
	return nil
}

// sealRecords makes the stream of an idempotency bucket refuse what would
// wipe records in one stroke: rollups (a `Nats-Rollup` header on any
// publish), purges and message deletes through the JetStream API. Keys
// are still deleted one by one (a delete marker is an ordinary publish),
// which is how a failed call releases its reservation.
func (t Topology) sealRecords(ctx context.Context, js jetstream.JetStream, stream string) error {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("events: provision %s: %w", stream, err)
	}
	cfg := st.CachedInfo().Config
	if !cfg.AllowRollup && cfg.DenyDelete && cfg.DenyPurge {
		return nil
	}
	cfg.AllowRollup, cfg.DenyDelete, cfg.DenyPurge = false, true, true
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("events: provision %s: %w", stream, err)
	}
	return nil
}

// Provision creates or updates every stream, consumer and bucket. It is
// idempotent: running it again changes nothing that is already as declared.
// A consumer whose ack policy differs from the declared one (the
// auditor's, provisioned before they acknowledged by position) is deleted
// and created again from its ack floor (see [MetaDeliveredBefore]); the
// auditor is to be stopped while it is.
// It needs JetStream admin rights; services only [Topology.Check].
func (t Topology) Provision(ctx context.Context, js jetstream.JetStream) error {
	if t.Partitions == 0 {
		// Unset keeps what the streams were provisioned with: adding a
		// pool must not move every run to another partition.
		st, err := js.Stream(ctx, t.StreamRuns())
		if err == nil {
			t.Partitions, _ = PartitionsOf(st.CachedInfo().Config)
		}
	}
	if err := t.Validate(); err != nil {
		return err
	}
	t = t.withDefaults()
	if err := t.checkRunsStream(ctx, js); err != nil {
		return err
	}
	if err := t.checkStaleDispatcherConsumers(ctx, js); err != nil {
		return err
	}
	for _, sc := range t.Streams() {
		if _, err := js.CreateOrUpdateStream(ctx, sc); err != nil {
			return fmt.Errorf("events: provision stream %s: %w", sc.Name, err)
		}
	}
	for _, cs := range t.Consumers() {
		if err := t.provisionConsumer(ctx, js, cs); err != nil {
			return err
		}
	}
	if err := t.removeStaleDispatcherConsumers(ctx, js); err != nil {
		return err
	}
	for _, kc := range t.Buckets() {
		if t.idempotencyBucket(kc.Bucket) {
			// A sealed bucket's stream can never allow purges again, which
			// a key-value update would ask for: create it once, then
			// only its stream's limits are updated.
			if err := t.provisionSealed(ctx, js, kc); err != nil {
				return err
			}
		} else if _, err := js.CreateOrUpdateKeyValue(ctx, kc); err != nil {
			return fmt.Errorf("events: provision bucket %s: %w", kc.Bucket, err)
		}
		if kc.Bucket == t.BucketRuns() || t.idempotencyBucket(kc.Bucket) || kc.Bucket == t.BucketLimits() || kc.Bucket == t.BucketPlannerLimits() {
			// Run state and idempotency keys are read to be written with
			// a revision check: reads must come from the stream leader.
			// Direct gets may be answered by a follower that lags behind
			// (right after a node loss, for a while), and a stale
			// revision would make every revision-checked write conflict.
			if err := t.leaderReads(ctx, js, "KV_"+kc.Bucket); err != nil {
				return err
			}
		}
		if t.idempotencyBucket(kc.Bucket) {
			if err := t.sealRecords(ctx, js, "KV_"+kc.Bucket); err != nil {
				return err
			}
		}
	}
	for _, oc := range t.ObjectStores() {
		if _, err := js.CreateOrUpdateStream(ctx, objectStoreStream(oc)); err != nil {
			return fmt.Errorf("events: provision object store %s: %w", oc.Bucket, err)
		}
	}
	return nil
}

// objectStoreStream is the stream of the object store oc, as jetstream's
// CreateObjectStore declares it but for direct gets, which it turns off:
// executors write their pool's store, and a party that may write a store
// and direct-get it has the server publish a body of its choosing on any
// subject of the account (docs/security.md, "Direct gets reflected").
// Declared whole, the store never answers a direct get, not even between
// its creation and an update. Readers take jetstream's message get
// instead ([GetFromLeader]; an object store handle does when the stream
// disallows direct gets).
func objectStoreStream(oc jetstream.ObjectStoreConfig) jetstream.StreamConfig {
	maxBytes := oc.MaxBytes
	if maxBytes == 0 {
		maxBytes = -1
	}
	replicas := oc.Replicas
	if replicas == 0 {
		replicas = 1
	}
	return jetstream.StreamConfig{
		Name:        "OBJ_" + oc.Bucket,
		Description: oc.Description,
		Subjects:    []string{"$O." + oc.Bucket + ".C.>", "$O." + oc.Bucket + ".M.>"},
		MaxAge:      oc.TTL,
		MaxBytes:    maxBytes,
		Storage:     oc.Storage,
		Replicas:    replicas,
		Placement:   oc.Placement,
		Discard:     jetstream.DiscardNew,
		AllowRollup: true,
		AllowDirect: false,
	}
}

// staleDispatcherConsumers calls fn with each existing dispatcher
// consumer that no partition of the topology has: those of partitions
// past [Topology.Partitions] and the single consumers of the layout
// before partitions.
func (t Topology) staleDispatcherConsumers(ctx context.Context, js jetstream.JetStream, fn func(stream, name string) error) error {
	t = t.withDefaults()
	keep := map[string]bool{}
	for p := range t.Partitions {
		for _, cs := range t.DispatcherConsumers(p) {
			keep[cs.Stream+"/"+cs.Config.Durable] = true
		}
	}
	for stream, base := range map[string]string{t.StreamRuns(): ConsumerDispatcher, t.StreamTimers(): ConsumerDispatcherTimers,
		t.StreamRequests(): ConsumerDispatcherRequests} {
		st, err := js.Stream(ctx, stream)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("events: provision %s: %w", stream, err)
		}
		lister := st.ConsumerNames(ctx)
		var stale []string
		for name := range lister.Name() {
			if !keep[stream+"/"+name] && staleDispatcherConsumer(base, name) {
				stale = append(stale, name)
			}
		}
		if err := lister.Err(); err != nil {
			return fmt.Errorf("events: provision %s: list consumers: %w", stream, err)
		}
		for _, name := range stale {
			if err := fn(stream, name); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkStaleDispatcherConsumers refuses, before anything is changed, to
// provision a layout that would remove a dispatcher consumer still
// holding events: no consumer of the new layout matches their stored
// subjects, so they would never be handled. Fewer partitions, or the
// first provisioning with partitions over a layout without them, need
// the dispatchers' consumers empty: clients stopped, the runs in flight
// ended.
func (t Topology) checkStaleDispatcherConsumers(ctx context.Context, js jetstream.JetStream) error {
	return t.staleDispatcherConsumers(ctx, js, func(stream, name string) error {
		cons, err := js.Consumer(ctx, stream, name)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("events: provision %s: consumer %s: %w", stream, name, err)
		}
		info := cons.CachedInfo()
		if info.NumPending == 0 && info.NumAckPending == 0 {
			return nil
		}
		return actionbus.Errorf(actionbus.CodeTopologyBusy,
			"consumer %s of %s still holds %d pending and %d unacknowledged events, which no consumer of %d partition(s) would handle: "+
				"stop the clients, let the dispatchers end the runs in flight, then provision again", name, stream, info.NumPending, info.NumAckPending, t.withDefaults().Partitions).
			WithDetail("stream", stream).WithDetail("consumer", name).WithDetail("pending", info.NumPending).WithDetail("ackPending", info.NumAckPending)
	})
}

// removeStaleDispatcherConsumers deletes the dispatcher consumers that no
// partition of the topology has ([Topology.checkStaleDispatcherConsumers]
// found them empty): left in place they would keep messages for nobody.
func (t Topology) removeStaleDispatcherConsumers(ctx context.Context, js jetstream.JetStream) error {
	return t.staleDispatcherConsumers(ctx, js, func(stream, name string) error {
		if err := js.DeleteConsumer(ctx, stream, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return fmt.Errorf("events: provision %s: remove consumer %s: %w", stream, name, err)
		}
		return nil
	})
}

// staleDispatcherConsumer reports whether name is a dispatcher consumer
// of base: the unpartitioned one or one partition's.
func staleDispatcherConsumer(base, name string) bool {
	if name == base {
		return true
	}
	p, ok := strings.CutPrefix(name, base+"-p")
	if !ok {
		return false
	}
	_, err := strconv.Atoi(p)
	return err == nil
}

// checkRunsStream refuses to provision over a runs stream that allows
// message schedules (as provisioned before the timers had a stream of
// their own): the server can never turn that off, and while it is on, any
// user that publishes into the stream can have the server write the
// dispatcher's events (see [Topology.StreamTimers]).
func (t Topology) checkRunsStream(ctx context.Context, js jetstream.JetStream) error {
	st, err := js.Stream(ctx, t.StreamRuns())
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("events: provision stream %s: %w", t.StreamRuns(), err)
	}
	if st.CachedInfo().Config.AllowMsgSchedules {
		return fmt.Errorf("events: provision: stream %s allows message schedules (an earlier layout, which lets any user that "+
			"publishes into it have the server write the dispatcher's events); the server cannot turn that off: stop the "+
			"services, delete the stream (`nats stream rm %s`; run state stays in its bucket) and provision again",
			t.StreamRuns(), t.StreamRuns())
	}
	return nil
}

// Requirements names what one service needs to exist.
type Requirements struct {
	Streams   []string
	Consumers []ConsumerSpec // only Stream and Config.Durable are read
	Buckets   []string
	Objects   []string
	// Pool is the executor pool whose stores these are ("" for a service
	// of no pool): Check's error then names `provision --pool`.
	Pool string
}

// Needs returns what a service ("dispatcher", "planner", "executor",
// "auditor", "client") needs. For "executor", pool names the pool.
func (t Topology) Needs(service, pool string) Requirements {
	t = t.withDefaults()
	c := func(stream, name string) ConsumerSpec {
		return ConsumerSpec{Stream: stream, Config: jetstream.ConsumerConfig{Durable: name}}
	}
	switch service {
	case "dispatcher":
		return Requirements{
			// The audit stream: the read service the dispatcher hosts
			// answers tenants' audit reads from it.
			Streams: []string{t.StreamRuns(), t.StreamTimers(), t.StreamRequests(), t.StreamWork(), t.StreamRejected(), t.StreamAudit()},
			// The partitions' consumers: the dispatcher checks those of
			// the count its streams were provisioned with when it starts.
			Buckets: []string{t.BucketRuns(), t.BucketCatalog(), t.BucketCatalogOwners(), t.BucketPolicy(), t.BucketLimits(), t.BucketDispatchers()},
			Objects: []string{t.BucketArtifacts()},
		}
	case "planner":
		return Requirements{
			Streams:   []string{t.StreamRuns(), t.StreamRejected()},
			Consumers: []ConsumerSpec{c(t.StreamRuns(), ConsumerPlanner)},
			Buckets:   []string{t.BucketCatalog(), t.BucketPlannerLimits()},
		}
	case "executor":
		if pool == "" {
			pool = DefaultPool
		}
		return Requirements{
			Streams:   []string{t.StreamRuns(), t.StreamWork(), t.StreamRejected()},
			Consumers: []ConsumerSpec{c(t.StreamWork(), PoolConsumer(pool))},
			Buckets:   []string{t.BucketPresence(pool), t.BucketIdempotency(pool)},
			Objects:   []string{t.PoolArtifacts(pool)},
			Pool:      pool,
		}
	case "auditor":
		return Requirements{
			Streams: []string{t.StreamRuns(), t.StreamTimers(), t.StreamRequests(), t.StreamWork(), t.StreamRejected(), t.StreamAudit()},
			Consumers: []ConsumerSpec{c(t.StreamRuns(), ConsumerAuditorRuns), c(t.StreamTimers(), ConsumerAuditorTimers),
				c(t.StreamRequests(), ConsumerAuditorRequests), c(t.StreamWork(), ConsumerAuditorWork), c(t.StreamRejected(), ConsumerAuditorRejected)},
			Buckets: []string{t.BucketCatalog()},
		}
	default:
		return Requirements{Streams: []string{t.StreamRuns(), t.StreamRequests()}}
	}
}

// Check verifies that everything in req exists. The error is an
// *actionbus.Error with code missing_topology whose message names every
// missing stream, consumer and bucket, and says how to create them: the
// command in details.command (`actionbus provision --nats <url>`, with
// `--pool P` for an executor's requirements of pool P).
func (t Topology) Check(ctx context.Context, js jetstream.JetStream, req Requirements) error {
	var missing []string
	var other []error
	note := func(kind, name string, err error) {
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound), errors.Is(err, jetstream.ErrConsumerNotFound),
			errors.Is(err, jetstream.ErrBucketNotFound), errors.Is(err, jetstream.ErrStreamNotFound):
			missing = append(missing, kind+" "+name)
		default:
			other = append(other, fmt.Errorf("%s %s: %w", kind, name, err))
		}
	}
	for _, s := range req.Streams {
		if _, err := js.Stream(ctx, s); err != nil {
			note("stream", s, err)
		}
	}
	for _, c := range req.Consumers {
		if _, err := js.Consumer(ctx, c.Stream, c.Config.Durable); err != nil {
			note("consumer", c.Stream+"/"+c.Config.Durable, err)
		}
	}
	for _, b := range req.Buckets {
		if _, err := js.KeyValue(ctx, b); err != nil {
			note("bucket", b, err)
		}
	}
	for _, o := range req.Objects {
		if _, err := js.ObjectStore(ctx, o); err != nil {
			note("object store", o, err)
		}
	}
	if len(other) > 0 {
		return fmt.Errorf("events: check topology: %w", errors.Join(other...))
	}
	if len(missing) > 0 {
		command := "actionbus provision --nats <url>"
		why := ""
		if req.Pool != "" {
			// A pool's work consumer and stores exist only once it is
			// provisioned by name: the default provisions pool default.
			command += " --pool " + req.Pool
			why = " (a pool's work consumer and stores exist only once `provision` names the pool; name every pool the deployment serves)"
		}
		return (&actionbus.Error{
			Code:    actionbus.CodeMissingTopology,
			Message: "missing " + strings.Join(missing, ", ") + "; create them with `" + command + "`" + why,
		}).WithDetail("missing", missing).WithDetail("command", command)
	}
	return nil
}
