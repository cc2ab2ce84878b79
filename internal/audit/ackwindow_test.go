package audit

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestAckWindow drives the window through deliveries ("t5": message at
// stream sequence 5 taken, its consumer sequence the next, its delivery
// count how often it was delivered in the steps), lost deliveries ("l5":
// message 5 delivered, the next consumer sequence taken, and never
// received), stored records ("s5"), failed handling ("f5"), the end of
// the wait for the earlier process's messages ("forget") and
// acknowledgements ("a": what next answers, "-" for nothing). take's
// answers are noted after each take: "h" handle, "-" do not, "alone"
// acknowledge this delivery by itself.
func TestAckWindow(t *testing.T) {
	type start struct {
		floor, delivered uint64
		pending          int
	}
	cases := []struct {
		name  string
		start start
		steps string
		want  string
	}{
		{"in order", start{}, "t1 t2 t3 s1 s2 a s3 a a", "t1:h t2:h t3:h a:2 a:3 a:-"},
		{"a stored record after an unstored one is not acknowledged",
			start{}, "t1 t2 t3 s3 s2 a s1 a", "t1:h t2:h t3:h a:- a:3"},
		{"out of order completions wait for the first",
			start{}, "t1 t2 t3 t4 s4 s2 a s1 a s3 a", "t1:h t2:h t3:h t4:h a:- a:2 a:4"},
		{"gaps are other subjects' messages", start{}, "t3 t7 t20 s3 s7 a s20 a", "t3:h t7:h t20:h a:7 a:20"},
		{"a delivery while it is handled is not handled again",
			start{}, "t1 t1 s1 a", "t1:h t1:- a:1"},
		{"a stored message delivered again is not handled again",
			start{}, "t1 t2 s2 t2 a s1 a", "t1:h t2:h t2:- a:- a:2"},
		{"a failed message's next delivery is handled",
			start{}, "t1 t2 f1 s2 a t1 s1 a", "t1:h t2:h a:- t1:h a:2"},
		{"a delivery at or before the floor is acknowledged alone",
			start{floor: 10}, "t9 t11 s11 a t11", "t9:alone t11:h a:11 t11:alone"},
		{"the earlier process's messages come again before anything is acknowledged",
			start{floor: 10, delivered: 20, pending: 2},
			"t21 s21 a t12 s12 a t15 a s15 a", "t21:h a:- t12:h a:- t15:h a:12 a:21"},
		{"an earlier message taken twice counts once",
			start{floor: 10, delivered: 20, pending: 2},
			"t12 f12 t12 s12 t22 s22 a t14 s14 a", "t12:h t12:h t22:h a:- t14:h a:22"},
		{"forgetting the earlier messages", start{floor: 10, delivered: 20, pending: 3},
			"t21 s21 a forget a", "t21:h a:- a:21"},
		{"no pending earlier messages", start{floor: 10, delivered: 20}, "t21 s21 a", "t21:h a:21"},
		{"a stored mark of an acknowledged message changes nothing",
			start{}, "t1 s1 a s1 f1 a", "t1:h a:1 a:-"},
		{"a lost delivery holds acknowledgements until it comes again",
			start{}, "t1 l2 t3 s1 s3 a t2 s2 a", "t1:h t3:h a:- t2:h a:3"},
		{"a lost redelivery is waited for too",
			start{}, "t1 t2 f2 l2 t3 s1 s3 a t2 s2 a", "t1:h t2:h t3:h a:- t2:h a:3"},
		{"a message it holds, delivered again, does not stand in for a lost one",
			start{}, "t1 f1 l2 t1 t3 s1 s3 a t2 s2 a", "t1:h t1:h t3:h a:- t2:h a:3"},
		{"a first delivery does not stand in for a lost one",
			start{}, "t1 l2 t3 t4 s1 s3 s4 a t2 s2 a", "t1:h t3:h t4:h a:- t2:h a:4"},
		{"forgetting covers lost deliveries", start{}, "t1 l2 t3 s1 s3 a forget a", "t1:h t3:h a:- a:3"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := newAckWindow[string](tc.start.floor, tc.start.delivered, 0, tc.start.pending)
			var got []string
			deliveries := map[uint64]int{}
			consumerSeq := uint64(0)
			for _, step := range strings.Fields(tc.steps) {
				var seq uint64
				switch {
				case step == "forget":
					w.forgetEarlier()
				case step == "a":
					msg, seq, ok := w.next()
					if !ok {
						got = append(got, "a:-")
						continue
					}
					assert.Equal(t, fmt.Sprintf("m%d#%d", seq, deliveries[seq]), msg, "the newest delivery is acknowledged")
					got = append(got, fmt.Sprintf("a:%d", seq))
				default:
					fmt.Sscanf(step[1:], "%d", &seq)
					switch step[0] {
					case 'l':
						deliveries[seq]++
						consumerSeq++
					case 't':
						deliveries[seq]++
						consumerSeq++
						handle, alone := w.take(seq, consumerSeq, uint64(deliveries[seq]), fmt.Sprintf("m%d#%d", seq, deliveries[seq]))
						verdict := "-"
						if handle {
							verdict = "h"
						}
						if alone {
							verdict = "alone"
						}
						got = append(got, fmt.Sprintf("t%d:%s", seq, verdict))
					case 's':
						w.stored(seq)
					case 'f':
						w.failed(seq)
					}
				}
			}
			assert.Equal(t, tc.want, strings.Join(got, " "))
		})
	}
}

// The window holds what it has not acknowledged, and nothing after an
// acknowledgement that covers everything.
func TestAckWindowSize(t *testing.T) {
	w := newAckWindow[int](0, 0, 0, 0)
	for seq := uint64(1); seq <= 100; seq++ {
		w.take(seq, seq, 1, int(seq))
	}
	for seq := uint64(100); seq >= 2; seq-- {
		w.stored(seq)
	}
	_, _, ok := w.next()
	assert.False(t, ok)
	assert.Equal(t, 100, w.size())
	w.stored(1)
	_, seq, ok := w.next()
	assert.True(t, ok)
	assert.EqualValues(t, 100, seq)
	assert.Equal(t, 0, w.size())
	assert.False(t, w.waitingForEarlier())
}
