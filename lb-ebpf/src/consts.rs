//! Protocol constants of the XDP programs, each defined once.

/// Ethernet header length (no VLAN tag).
pub const ETH_LEN: usize = 14;
pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86dd;
pub const ETH_P_8021Q: u16 = 0x8100;

/// IPv4 header length without options.
pub const IPV4_HDR_LEN: usize = 20;
pub const IPV6_HDR_LEN: usize = 40;

/// IP protocol numbers of the tunnels: IPv4 in IP (IPIP) and IPv6 in IP (IP6IP6). One byte,
/// as in the header (`lb_common::maps::PROTO_TCP` and friends are the same type).
pub const IPPROTO_IPIP: u8 = 4;
pub const IPPROTO_IPV6: u8 = 41;
