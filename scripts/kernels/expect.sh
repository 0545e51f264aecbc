# scripts/kernels/expect.sh: sourced by scripts/kernels.sh. What the layer loads, runs and expects
# per kernel.

# Modules the guest loads before the tests (a name missing from a kernel is recorded in `facts`;
# the tests that need a feature fail loudly without it).
GUEST_MODULES=(veth bridge 8021q vxlan ipip ip_gre ip6_gre ip6_tunnel sit fou fou6
  dummy macvlan ip_vs ip_vs_rr nf_tables nf_conntrack nf_conntrack_netlink nfnetlink
  nf_nat nf_reject_ipv4 nf_reject_ipv6 nft_chain_nat nft_ct nft_nat nft_masq nft_redir
  nft_reject nft_reject_inet nft_reject_bridge nft_reject_ipv4 nft_reject_ipv6
  nft_limit nft_log nft_compat nft_fib nft_fib_inet nft_fib_ipv4 nft_fib_ipv6 nft_hash
  nft_numgen nft_quota nft_socket nft_tproxy nft_meta_bridge nft_objref
  nft_connlimit nft_dup_netdev
  nft_fwd_netdev nf_log_syslog nf_conntrack_bridge bridge xt_conntrack xt_MASQUERADE
  xt_nat xt_comment xt_addrtype xt_mark xt_tcpudp xt_REDIRECT xt_CT iptable_nat iptable_filter
  iptable_raw iptable_mangle ip6table_nat ip6table_filter ip6table_raw ip6table_mangle
  ip_tables ip6_tables x_tables nf_nat_ftp tun overlay)

# Seconds one test binary is given in the VM (a deadline, not a measurement): the guest ends a
# binary at twice its budget, a boot's deadline is twice the sum.
test_budget() {
  case $1 in
  process) echo 300 ;;
  kernel_features) echo 600 ;;
  *) echo 1200 ;;
  esac
}

# ci_runs SUITE BINARY: with --ci, whether CI runs that binary on that kernel. On 5.10, the
# oldest kernel natguard supports (Amazon Linux 2's), where nf_tables and the bridge layer are
# furthest from the host's, CI runs every binary (security and datapath cut by ci_filter). The
# host runs every test itself in `cargo test`, on its newer kernel. Between the two, CI runs on
# 6.1 and 6.12 what has code or behaviour of its own per kernel (conntrack's delete and IPv6
# filter, the kernel facts, the process' sandbox), restarts and the IPv6 endpoints; not the
# attacks and traffic of security and datapath, whose rulesets and packet paths use the same
# nf_tables features there as on 5.10 and on the host. The full layer (scripts/kernels.sh
# without --ci) runs every binary on every kernel, as before a release.
ci_runs() {
  case $1/$2 in
  bookworm/security | bookworm/datapath | trixie/security | trixie/datapath) return 1 ;;
  *) return 0 ;;
  esac
}

# ci_filter BINARY: with --ci, the test-name filters (substrings, as libtest takes them) that
# select the subset CI runs of that binary on every kernel; nothing printed: the whole binary.
# security.rs is the one cut: its whole run takes about 8 minutes per kernel under emulation; the
# subset keeps one attack of each kind that has a kernel-specific datapath (address theft on a
# bridge and on ptp, hand-made segments, another component's DNAT and NOTRACK in nft) and every
# case of the node-wide guard (tags, MAC theft, tunnels, unseen pods, bypassing primaries,
# counters, redirects and logs by sender, a flushed ruleset, unmanaged bridges, a link-local
# neighbour advertisement, two attachments sharing one address on a bridge, one exempt pod
# claiming another's addresses).
ci_filter() {
  case $1 in
  datapath)
    # Every test that sends traffic through the kernel's datapath (metadata modes, the proxy
    # refused when down, masquerade and its exceptions against other components' rules, tc
    # steering, two networks and a reused address) and the two that read the kernel's state
    # back (CHECK, status); not the CNI protocol's (versions, DEL variants, GC, config changes,
    # the example lists, the harness), whose kernel work is the same nft batches the others
    # commit: they run on the host in every CI run, and in the full kernel layer.
    echo "baseline_topology proxy_mode_sends exempt_namespace_reaches deny_mode_resets" \
      "off_mode_leaves proxy_down_is_refused masquerade_keeps_pod_source" \
      "masquerade_disabled_keeps by_default_natguard_masquerades a_tc_redirect_on_the_host_veth" \
      "identity_snat_beats kube_proxy_masquerade_mark same_ip_add_a_add_b_del_a_keeps_b" \
      "two_networks_do_not_clobber check_fails_when_kernel_state_is_missing" \
      "status_succeeds_where_nftables_works"
    ;;
  conntrack)
    # Every test but the one-pass burst, whose premise (eight ADDs writing their requests
    # within the pass's 10 s wait) is a matter of timing under emulation; it runs on the host
    # in every CI run, and in the full kernel layer.
    echo "auto_path_flushes entries_vanishing fallback_and_full_dump a_pass_lock_held_forever" \
      "ipv6_filtered_deletes ip_reuse_flush the_ipv6_filter_probe undnatted_flows"
    ;;
  security)
    echo "address_theft_on_a_bridge_never address_theft_on_ptp crafted_tcp_segments" \
      "clusterip_dnat_of_a_native_nft_table notrack_for_pod_sources_in_a_raw_priority" \
      "vlan_tagged_claims mac_theft_on_a_bridge vxlan_decapsulated a_ptp_pod_natguard_never_saw" \
      "a_primary_that_bypasses reset_counters_name redirects_counters_and_logs_name after_a_flushed_ruleset" \
      "a_bridge_no_network_manages a_neighbour_advertisement_from_a_link_local" \
      "address_theft_by_a_pod_natguard_never_saw address_and_mac_theft_by_a_pod_natguard_never_saw" \
      "an_exempt_pod_without_interfaces overlapping_networks_never_act" \
      "a_host_side_that_is_not_the_pods_veth a_proxy_target_admits_only" \
      "vlan_tagged_claims_from_a_pod_natguard_never_saw an_exempt_pods_veth_marks_its_frames" \
      "claims_from_a_bridge_of_an_exempt_pod_on_ptp a_deny_networks_pod_with_an_exempt_pods_address" \
      "a_second_attachment_with_an_exempt_pods_address an_exempt_pod_claiming_another_exempt_pods"
    ;;
  endpoints)
    # The IPv6 metadata addresses (GCE's fd20:ce::254, Oracle's fd00:c1::a9fe:a9fe), each with
    # its IPv4 one, against real servers; the other presets differ only by address and port.
    echo "gcp_preset"
    ;;
  esac
}

# kernel_expect SUITE: what natguard's kernel-specific code must do on this kernel, as the tests
# read it from NATGUARD_KERNEL_EXPECT.
kernel_expect() {
  case $1 in
  bullseye) echo "ct_delete=dump ipv6_filter=inverted set_counters=yes io_uring_sysctl=absent" ;;
  bookworm) echo "ct_delete=dump ipv6_filter=inverted set_counters=yes io_uring_sysctl=absent" ;;
  trixie) echo "ct_delete=filtered ipv6_filter=exact set_counters=yes io_uring_sysctl=present" ;;
  esac
}
