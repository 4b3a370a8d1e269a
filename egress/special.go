package egress

import "net/netip"

// special is every address range egress refuses unless the operator lists
// it (Policy.AllowPrivate): the ranges of IANA's special-purpose address
// registries (RFC 6890 and its updates) that are not globally reachable,
// those reserved for benchmarks and the future, and the
// IPv6 ranges that lead to an IPv4 address by a tunnel or a translator,
// which a session could otherwise use to reach a refused IPv4 address
// spelled as IPv6; and all of IPv6 outside its global unicast space. The
// one exception is NAT64's well-known prefix
// (nat64): a DNS64 resolver answers it for every IPv4-only name on an
// IPv6-only network, so an address in it is judged as the IPv4 address it
// carries. Refused walks this table, and TestSpecialRanges walks it too.
//
// The documentation ranges (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24,
// 2001:db8::/32, 3fff::/20) are not here: nothing routes them on the
// Internet, so reaching one is no way into a private network, and a
// network may route them itself — this project's build machines resolve
// public names (proxy.golang.org) to 203.0.113.0/24, where their egress
// gateway listens, so refusing it would refuse every preset there.
var special = []struct {
	prefix netip.Prefix
	what   string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "this network"},
	{netip.MustParsePrefix("10.0.0.0/8"), "private"},
	{netip.MustParsePrefix("100.64.0.0/10"), "shared address space (carrier-grade NAT)"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local (cloud metadata)"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private"},
	{netip.MustParsePrefix("192.0.0.0/24"), "IETF protocol assignments"},
	{netip.MustParsePrefix("192.88.99.0/24"), "6to4 relay anycast (deprecated)"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved, and the limited broadcast address"},

	// Within IPv6's global unicast space, 2000::/3:
	{netip.MustParsePrefix("2001::/23"), "IETF protocol assignments (Teredo 2001::/32, benchmarking, ORCHID)"},
	{netip.MustParsePrefix("2002::/16"), "6to4"},
	// Outside it, named where the range has a meaning, and then the rest
	// (the catch-alls, last: the first range that holds an address names
	// it).
	{netip.MustParsePrefix("::/96"), "IPv4-compatible (deprecated), the unspecified address and loopback"},
	{netip.MustParsePrefix("::ffff:0:0:0/96"), "IPv4-translated (SIIT)"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "local-use IPv4/IPv6 translation"},
	{netip.MustParsePrefix("100::/64"), "discard only"},
	{netip.MustParsePrefix("5f00::/16"), "segment routing (SRv6) SIDs"},
	{netip.MustParsePrefix("fc00::/7"), "unique local (private)"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	{netip.MustParsePrefix("fec0::/10"), "site-local (deprecated)"},
	{netip.MustParsePrefix("ff00::/8"), "multicast"},
	{netip.MustParsePrefix("::/3"), notGlobal},
	{netip.MustParsePrefix("4000::/2"), notGlobal},
	{netip.MustParsePrefix("8000::/1"), notGlobal},
}

// notGlobal names IPv6 addresses outside 2000::/3, the only IPv6 space
// allocated for global unicast.
const notGlobal = "outside IPv6's global unicast space 2000::/3"

// nat64 is NAT64's well-known prefix (RFC 6052): an address in it is the
// IPv4 address in its last 32 bits, reached through a translator.
var nat64 = netip.MustParsePrefix("64:ff9b::/96")

// subject is the address a decision about a is made on: a itself, an
// IPv4-mapped address's IPv4 address, and a NAT64 address's.
func subject(a netip.Addr) netip.Addr {
	a = a.Unmap()
	if nat64.Contains(a) {
		b := a.As16()
		return netip.AddrFrom4([4]byte(b[12:]))
	}
	return a
}

// Refused reports whether a is an address egress refuses unless the
// operator lists it (Policy.AllowPrivate): one in a range of the special
// table — loopback, private, link-local (cloud metadata), shared,
// multicast, reserved and benchmarking ranges, the IPv6
// ranges that tunnel or translate to IPv4 (6to4, Teredo, IPv4-compatible,
// SIIT, local-use NAT64), and every IPv6 address outside the global
// unicast space 2000::/3. An IPv4-mapped address, and
// one in NAT64's well-known prefix 64:ff9b::/96, is judged as the IPv4
// address it carries.
func Refused(a netip.Addr) bool {
	_, refused := refusedAs(a)
	return refused
}

// refusedAs is Refused's answer and the range that refuses a.
func refusedAs(a netip.Addr) (what string, refused bool) {
	a = subject(a)
	for _, r := range special {
		if r.prefix.Contains(a) {
			return r.what, true
		}
	}
	return "", !a.IsValid() || a.Zone() != ""
}
