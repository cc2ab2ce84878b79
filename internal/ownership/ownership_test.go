package ownership_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/internal/ownership"
)

func members(n int) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf("dispatcher-%d-%x", i, i*7919))
	}
	return out
}

func TestEveryPartitionHasOneOwnerAndLoadsAreBalanced(t *testing.T) {
	for _, tc := range []struct{ partitions, members int }{
		{1, 1}, {1, 3}, {6, 1}, {6, 2}, {6, 3}, {6, 4}, {12, 5}, {32, 3}, {32, 32}, {4, 8},
	} {
		t.Run(fmt.Sprintf("%dp_%dm", tc.partitions, tc.members), func(t *testing.T) {
			ms := members(tc.members)
			owners := ownership.Assign(tc.partitions, ms)
			require.Len(t, owners, tc.partitions)
			load := map[string]int{}
			for p, o := range owners {
				require.Contains(t, ms, o, "partition %d", p)
				load[o]++
			}
			limit := (tc.partitions + tc.members - 1) / tc.members
			floor := tc.partitions / tc.members
			total := 0
			for _, m := range ms {
				assert.Contains(t, []int{floor, limit}, load[m], "%s owns %d", m, load[m])
				total += len(ownership.Owned(tc.partitions, ms, m))
			}
			assert.Equal(t, tc.partitions, total, "Owned covers every partition once")
		})
	}
}

func TestEveryMemberComputesTheSameAssignment(t *testing.T) {
	ms := members(4)
	want := ownership.Assign(16, ms)
	shuffled := []string{ms[2], ms[0], ms[3], ms[1], ms[2], ""}
	assert.Equal(t, want, ownership.Assign(16, shuffled), "order, duplicates and empty names change nothing")
}

func TestNoMembersOwnNothing(t *testing.T) {
	assert.Equal(t, []string{"", ""}, ownership.Assign(2, nil))
	assert.Empty(t, ownership.Owned(2, nil, "a"))
}

// A member that joins takes about its share; one that leaves hands on
// its own partitions and few others move.
func TestAMemberComingOrGoingMovesLittleBesidesItsShare(t *testing.T) {
	const partitions = 32
	ms := members(4)
	before := ownership.Assign(partitions, ms)
	after := ownership.Assign(partitions, append(slices.Clone(ms), "newcomer"))
	moved := 0
	for p := range partitions {
		if before[p] != after[p] {
			moved++
		}
	}
	share := partitions / 5
	assert.LessOrEqual(t, moved, 2*share+1, "a join moved %d of %d partitions", moved, partitions)

	gone := ownership.Assign(partitions, ms[1:])
	movedOthers := 0
	for p := range partitions {
		if before[p] != ms[0] && before[p] != gone[p] {
			movedOthers++
		}
	}
	assert.LessOrEqual(t, movedOthers, share, "a leave moved %d partitions it did not own", movedOthers)
}
