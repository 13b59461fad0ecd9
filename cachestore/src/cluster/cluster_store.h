// The Store interface over a cluster of nodes (DESIGN §6): blocks placed by
// rendezvous hashing of their chain keys over the live nodes in a
// Membership, each written to R of them; match asks every node that may
// hold a block of the prompt in parallel, fetch reads each block from one
// replica that reported it and fails over to another, commit writes all R
// replicas best effort and reports per block.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "strata/client_options.h"
#include "strata/membership.h"
#include "strata/store.h"

namespace strata {

// `options` are those of each node's client, except:
//  - options.timeout bounds a whole cluster call: a node call gets a third
//    of it, so a fetch that waited out a dead replica still has time to
//    read from another, and a node commit (reserve, write, publish) fits;
//  - replication_factor 0 takes the membership's setting, and follows it
//    when it changes (etcd's settings/replication_factor).
// Fails when no node of the membership answers.
Result<std::unique_ptr<Store>> OpenClusterStore(std::shared_ptr<Membership> membership,
                                                const ClientOptions& options);

// "h1:p1,h2:p2,...": a static node list; each node's id is its address.
Result<std::vector<NodeInfo>> ParseNodeList(std::string_view list);

}  // namespace strata
