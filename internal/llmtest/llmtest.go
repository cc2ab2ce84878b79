// Package llmtest serves a scripted OpenAI-compatible chat-completions
// endpoint on a loopback httptest server, for tests of the openai planner
// provider: replies come from a queue or from a function of the request,
// with tool calls, HTTP errors, delays, tool rejection and SSE streaming.
//
// It is a test double for the LLM, not for NATS: everything else in a test
// that uses it is real.
package llmtest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// Reply is one scripted answer of the endpoint.
type Reply struct {
	// Content is the assistant message text.
	Content string
	// ToolCalls are native tool calls in the assistant message.
	ToolCalls []ToolCall
	// Status, when not 0 or 200, answers with that HTTP status and an
	// OpenAI-style error body carrying ErrorMessage.
	Status       int
	ErrorMessage string
	// Delay holds the reply back (or until the client gives up).
	Delay time.Duration
	// Usage is the usage the reply reports; nil reports 1 prompt and 1
	// completion token. NoUsage reports none at all (endpoints that do not
	// count).
	Usage   *Usage
	NoUsage bool
}

// Usage is a reply's token counts.
type Usage struct {
	PromptTokens, CompletionTokens int
}

// ToolCall is one native tool call.
type ToolCall struct {
	Name      string
	Arguments string
}

// Call returns a tool call with args marshaled to JSON.
func Call(name string, args any) ToolCall {
	b, err := json.Marshal(args)
	if err != nil {
		panic(err)
	}
	return ToolCall{Name: name, Arguments: string(b)}
}

// Request is a chat-completions request as the server received it.
type Request struct {
	Model    string    `json:"model"`
	Messages []Message `json:"messages"`
	Tools    []Tool    `json:"tools"`
	Stream   bool      `json:"stream"`
}

// Message is one message of a request.
type Message struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	ToolCallID string          `json:"tool_call_id"`
	ToolCalls  []struct {
		ID       string `json:"id"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

// Text returns the message content as text (string content, or the text
// parts joined).
func (m Message) Text() string {
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		return s
	}
	var parts []struct {
		Text string `json:"text"`
	}
	_ = json.Unmarshal(m.Content, &parts)
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return b.String()
}

// Tool is one tool definition of a request.
type Tool struct {
	Type     string `json:"type"`
	Function struct {
		Name        string         `json:"name"`
		Description string         `json:"description"`
		Parameters  map[string]any `json:"parameters"`
	} `json:"function"`
}

// Last returns the last message of the request.
func (r Request) Last() Message {
	if len(r.Messages) == 0 {
		return Message{}
	}
	return r.Messages[len(r.Messages)-1]
}

// All returns the text of every message, joined; handy for matching.
func (r Request) All() string {
	var b strings.Builder
	for _, m := range r.Messages {
		b.WriteString(m.Text())
		b.WriteString("\n")
	}
	return b.String()
}

// Server is the scripted endpoint. Its URL is the base URL to configure
// (requests go to URL + "/chat/completions").
type Server struct {
	*httptest.Server
	mu          sync.Mutex
	queue       []Reply
	respond     func(Request) Reply
	requests    []Request
	rejectTools bool
	inFlight    int
	maxInFlight int
}

// MaxInFlight returns the most requests the server was answering at once.
func (s *Server) MaxInFlight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxInFlight
}

// New starts a server closed at the end of the test.
func New(t testing.TB) *Server {
	s := &Server{}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

// Script queues replies, answered in order.
func (s *Server) Script(replies ...Reply) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queue = append(s.queue, replies...)
}

// Respond answers every request the queue does not cover with fn.
func (s *Server) Respond(fn func(Request) Reply) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.respond = fn
}

// RejectTools makes requests with tools fail with HTTP 400.
func (s *Server) RejectTools() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rejectTools = true
}

// Requests returns the requests received so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/chat/completions") {
		writeError(w, http.StatusNotFound, "no route "+r.URL.Path)
		return
	}
	var req Request
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "bad json: "+err.Error())
		return
	}
	s.mu.Lock()
	s.inFlight++
	s.maxInFlight = max(s.maxInFlight, s.inFlight)
	defer func() {
		s.mu.Lock()
		s.inFlight--
		s.mu.Unlock()
	}()
	s.requests = append(s.requests, req)
	reject := s.rejectTools && len(req.Tools) > 0
	var reply Reply
	switch {
	case reject:
		reply = Reply{Status: http.StatusBadRequest, ErrorMessage: "this model does not support tools"}
	case len(s.queue) > 0:
		reply, s.queue = s.queue[0], s.queue[1:]
	case s.respond != nil:
		reply = s.respond(req)
	default:
		reply = Reply{Status: http.StatusInternalServerError, ErrorMessage: "llmtest: no scripted reply left"}
	}
	s.mu.Unlock()
	if reply.Delay > 0 {
		select {
		case <-time.After(reply.Delay):
		case <-r.Context().Done():
			return
		}
	}
	if reply.Status != 0 && reply.Status != http.StatusOK {
		writeError(w, reply.Status, reply.ErrorMessage)
		return
	}
	if req.Stream {
		writeStream(w, req.Model, reply)
		return
	}
	msg := map[string]any{"role": "assistant", "content": reply.Content}
	finish := "stop"
	if len(reply.ToolCalls) > 0 {
		msg["tool_calls"] = toolCalls(reply.ToolCalls)
		finish = "tool_calls"
	}
	w.Header().Set("Content-Type", "application/json")
	body := map[string]any{
		"id": "chatcmpl-llmtest", "object": "chat.completion", "created": time.Now().Unix(), "model": req.Model,
		"choices": []any{map[string]any{"index": 0, "message": msg, "finish_reason": finish}},
	}
	if !reply.NoUsage {
		u := Usage{PromptTokens: 1, CompletionTokens: 1}
		if reply.Usage != nil {
			u = *reply.Usage
		}
		body["usage"] = map[string]any{"prompt_tokens": u.PromptTokens, "completion_tokens": u.CompletionTokens, "total_tokens": u.PromptTokens + u.CompletionTokens}
	}
	_ = json.NewEncoder(w).Encode(body)
}

func toolCalls(calls []ToolCall) []any {
	out := make([]any, len(calls))
	for i, c := range calls {
		out[i] = map[string]any{"id": fmt.Sprintf("call_%d", i+1), "type": "function",
			"function": map[string]any{"name": c.Name, "arguments": c.Arguments}}
	}
	return out
}

// writeStream answers as server-sent events: the content word by word,
// then the tool calls in one chunk, then [DONE].
func writeStream(w http.ResponseWriter, model string, reply Reply) {
	w.Header().Set("Content-Type", "text/event-stream")
	flusher, _ := w.(http.Flusher)
	chunk := func(delta map[string]any, finish any) {
		b, _ := json.Marshal(map[string]any{"id": "chatcmpl-llmtest", "object": "chat.completion.chunk", "created": time.Now().Unix(), "model": model,
			"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish}}})
		fmt.Fprintf(w, "data: %s\n\n", b)
		if flusher != nil {
			flusher.Flush()
		}
	}
	chunk(map[string]any{"role": "assistant", "content": ""}, nil)
	for _, piece := range splitKeep(reply.Content) {
		chunk(map[string]any{"content": piece}, nil)
	}
	if len(reply.ToolCalls) > 0 {
		calls := toolCalls(reply.ToolCalls)
		for i := range calls {
			calls[i].(map[string]any)["index"] = i
		}
		chunk(map[string]any{"tool_calls": calls}, nil)
		chunk(map[string]any{}, "tool_calls")
	} else {
		chunk(map[string]any{}, "stop")
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	if flusher != nil {
		flusher.Flush()
	}
}

// splitKeep splits s after every space, so the pieces concatenate to s.
func splitKeep(s string) []string {
	var out []string
	for s != "" {
		i := strings.IndexByte(s, ' ')
		if i < 0 {
			return append(out, s)
		}
		out = append(out, s[:i+1])
		s = s[i+1:]
	}
	return out
}

func writeError(w http.ResponseWriter, status int, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
		"message": message, "type": "invalid_request_error", "param": nil, "code": nil}})
}
