// Package ownership decides which dispatcher owns which partition of the
// runs, from the set of live dispatchers alone: every dispatcher computes
// the same assignment from the same members, so no coordinator is needed.
//
// The assignment is balanced (each member owns ⌊partitions ÷ members⌋
// or one more) and stable: partitions are placed by rendezvous hashing, each
// on its highest-ranked member that still has room, so a member that
// comes or goes moves few partitions besides its own share.
package ownership

import (
	"hash/fnv"
	"slices"
	"strconv"
)

// Assign returns the owner of each partition (index = partition) among
// members. Duplicate and empty member names are ignored; with no member
// every owner is "".
func Assign(partitions int, members []string) []string {
	ms := slices.Compact(slices.Sorted(slices.Values(members)))
	ms = slices.DeleteFunc(ms, func(m string) bool { return m == "" })
	owners := make([]string, partitions)
	if len(ms) == 0 {
		return owners
	}
	// Every member owns floor partitions, and rem of them one more.
	floor, rem := partitions/len(ms), partitions%len(ms)
	load := make(map[string]int, len(ms))
	for p := range partitions {
		ranked := slices.Clone(ms)
		slices.SortFunc(ranked, func(a, b string) int {
			ha, hb := rank(a, p), rank(b, p)
			switch {
			case ha > hb:
				return -1
			case ha < hb:
				return 1
			}
			return 0
		})
		for _, m := range ranked {
			if load[m] < floor || load[m] == floor && rem > 0 {
				if load[m] == floor {
					rem--
				}
				owners[p] = m
				load[m]++
				break
			}
		}
	}
	return owners
}

// Owned returns the partitions member owns among members, in order.
func Owned(partitions int, members []string, member string) []int {
	var out []int
	for p, owner := range Assign(partitions, members) {
		if owner == member {
			out = append(out, p)
		}
	}
	return out
}

// rank is member's rendezvous weight for partition p (FNV-1a of both,
// finished by a mixer, since FNV's low bits vary little between close
// keys).
func rank(member string, p int) uint64 {
	h := fnv.New64a()
	h.Write([]byte(member))
	h.Write([]byte{0})
	h.Write([]byte(strconv.Itoa(p)))
	x := h.Sum64()
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}
