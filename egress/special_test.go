package egress

import (
	"math/rand/v2"
	"net/netip"
	"testing"
)

// TestSpecialRanges walks the table of refused ranges: each range's first,
// middle and last address is refused and named by it (or by a range before
// it, which a catch-all follows); the addresses just outside each range
// are allowed unless another range holds them, so every prefix length is
// what it says; every IPv4 range is refused as well spelled IPv4-mapped or
// through NAT64's well-known prefix; and whatever the standard library
// calls loopback, private, link-local, multicast or unspecified, the
// table refuses.
func TestSpecialRanges(t *testing.T) {
	holder := func(a netip.Addr) (int, bool) {
		for i, r := range special {
			if r.prefix.Contains(subject(a)) {
				return i, true
			}
		}
		return 0, false
	}
	for i, r := range special {
		if r.prefix != r.prefix.Masked() {
			t.Errorf("%s has host bits set", r.prefix)
		}
		first, last := r.prefix.Addr(), lastOf(r.prefix)
		for _, a := range []netip.Addr{first, middleOf(r.prefix), last} {
			what, refused := refusedAs(a)
			if j, _ := holder(a); !refused || j > i || (j == i && what != r.what) {
				t.Errorf("%s (in %s, %s): refused %v as %q", a, r.prefix, r.what, refused, what)
			}
			if a.Is4() {
				for _, spelled := range []netip.Addr{netip.AddrFrom16(a.As16()), nat64Of(a)} {
					if !Refused(spelled) {
						t.Errorf("%s, %s spelled as IPv6, is not refused", spelled, a)
					}
				}
			}
		}
		for _, a := range []netip.Addr{first.Prev(), last.Next()} {
			if _, held := holder(a); a.IsValid() && !held && Refused(a) {
				t.Errorf("%s, just outside %s, is refused", a, r.prefix)
			}
		}
	}
	if Refused(nat64Of(netip.MustParseAddr("8.8.8.8"))) {
		t.Error("NAT64 of a public IPv4 address is refused")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200_000 {
		var b [16]byte
		for i := range b {
			b[i] = byte(rng.UintN(256))
		}
		for _, a := range []netip.Addr{netip.AddrFrom16(b), netip.AddrFrom4([4]byte(b[:4]))} {
			if (!a.IsGlobalUnicast() || a.IsPrivate() || a.IsLoopback() || a.IsLinkLocalUnicast()) && !Refused(a) {
				t.Errorf("%s is not global by the standard library, yet not refused", a)
			}
		}
	}
}

func lastOf(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// middleOf is p's address with the first host bit set.
func middleOf(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	if i := p.Bits(); i < len(b)*8 {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

func nat64Of(a netip.Addr) netip.Addr {
	b := nat64.Addr().As16()
	v4 := a.As4()
	copy(b[12:], v4[:])
	return netip.AddrFrom16(b)
}
