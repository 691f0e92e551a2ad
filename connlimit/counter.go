package connlimit

import "sync"

// Counter counts what peers hold open (connections), in total and per peer, against two bounds. The zero value is
// ready; it is safe for concurrent use.
type Counter struct {
	mu    sync.Mutex
	open  int
	peers map[string]int
}

// Bound is the bound that refused an Admit, or Within.
type Bound int

const (
	Within  Bound = iota // admitted and counted
	Total                // the total is at its bound
	PerPeer              // the peer's count is at its bound
)

// Admit counts one more of peer, unless the total is at maxTotal (Total, checked first) or the peer's count at
// maxPerPeer (PerPeer); an admitted one is given back with Release.
func (c *Counter) Admit(peer string, maxTotal, maxPerPeer int) Bound {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.open >= maxTotal:
		return Total
	case c.peers[peer] >= maxPerPeer:
		return PerPeer
	}
	if c.peers == nil {
		c.peers = map[string]int{}
	}
	c.open++
	c.peers[peer]++
	return Within
}

// Release gives back one that Admit counted for peer.
func (c *Counter) Release(peer string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.open--
	if c.peers[peer]--; c.peers[peer] <= 0 {
		delete(c.peers, peer)
	}
}

// Open is how many are counted.
func (c *Counter) Open() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.open
}
