#include "accrue/dist/launch_env.h"

#include <charconv>
#include <cstdlib>
#include <optional>
#include <vector>

#include "accrue/core/error.h"

namespace accrue::dist {

namespace {

using Env = std::map<std::string, std::string>;

// One launcher's answer, before precedence and cross-checks.
struct LauncherSet {
  const char* launcher = "";
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1;
  // "RANK=1 WORLD_SIZE=2 ..." for errors that compare two launchers.
  std::string summary;
};

std::optional<std::string> lookup(const Env& env, const std::string& name) {
  auto it = env.find(name);
  if (it == env.end()) return std::nullopt;
  return it->second;
}

// A non-negative decimal integer that fits an int; anything else names the variable.
int parse_int(const std::string& name, const std::string& value) {
  int out = 0;
  const char* first = value.data();
  const char* last = first + value.size();
  auto [ptr, ec] = std::from_chars(first, last, out);
  ACCRUE_CHECK(!value.empty() && ec != std::errc::invalid_argument && ptr == last,
               "discover_rank: ", name, "='", value, "' is not an integer");
  ACCRUE_CHECK(ec != std::errc::result_out_of_range, "discover_rank: ", name, "='", value,
               "' is out of range");
  ACCRUE_CHECK(out >= 0, "discover_rank: ", name, "=", value, " must not be negative");
  return out;
}

int require_int(const Env& env, const char* launcher, const std::string& name,
                const std::string& present) {
  auto value = lookup(env, name);
  ACCRUE_CHECK(value.has_value(), "discover_rank: ", launcher, " variable ", present,
               " is set but ", name, " is not");
  return parse_int(name, *value);
}

// The first of `names` that is set, for "X is set but Y is not" messages.
std::optional<std::string> first_present(const Env& env, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (env.count(n)) return std::string(n) + "=" + env.at(n);
  return std::nullopt;
}

// Checks sizes and ranks of one set; names are the set's variable names.
void check_ranges(const LauncherSet& s, const char* rank, const char* world, const char* local,
                  const char* local_world) {
  ACCRUE_CHECK(s.world_size >= 1, "discover_rank: ", world, "=", s.world_size,
               " must be at least 1");
  ACCRUE_CHECK(s.local_world_size >= 1, "discover_rank: ", local_world, "=", s.local_world_size,
               " must be at least 1");
  ACCRUE_CHECK(s.rank < s.world_size, "discover_rank: ", rank, "=", s.rank, " is not below ", world,
               "=", s.world_size);
  ACCRUE_CHECK(s.local_rank < s.local_world_size, "discover_rank: ", local, "=", s.local_rank,
               " is not below ", local_world, "=", s.local_world_size);
  ACCRUE_CHECK(s.local_world_size <= s.world_size, "discover_rank: ", local_world, "=",
               s.local_world_size, " exceeds ", world, "=", s.world_size);
}

std::string summarize(const char* rank, const char* world, const char* local,
                      const char* local_world, const LauncherSet& s) {
  return detail::str_cat(rank, "=", s.rank, " ", world, "=", s.world_size, " ", local, "=",
                         s.local_rank, " ", local_world, "=", s.local_world_size);
}

// A four-variable set (torchrun and Open MPI share the shape).
std::optional<LauncherSet> read_set(const Env& env, const char* launcher, const char* rank,
                                    const char* world, const char* local, const char* local_world) {
  auto present = first_present(env, {rank, world, local, local_world});
  if (!present) return std::nullopt;
  LauncherSet s;
  s.launcher = launcher;
  s.rank = require_int(env, launcher, rank, *present);
  s.world_size = require_int(env, launcher, world, *present);
  s.local_rank = require_int(env, launcher, local, *present);
  s.local_world_size = require_int(env, launcher, local_world, *present);
  check_ranges(s, rank, world, local, local_world);
  s.summary = summarize(rank, world, local, local_world, s);
  return s;
}

// SLURM_TASKS_PER_NODE lists tasks per node in node order, runs compressed:
// "4(x2),3" is nodes 0 and 1 with 4 tasks, node 2 with 3. Returns node `node`'s
// count, or, when node < 0 (SLURM_NODEID unset), the count if all nodes agree.
int slurm_tasks_on_node(const std::string& value, int node) {
  const std::string name = "SLURM_TASKS_PER_NODE";
  const std::string entry = name + "='" + value + "' entry";  // names the whole list in errors
  std::vector<std::pair<int, int>> runs;                      // (tasks, nodes)
  size_t start = 0;
  while (start <= value.size()) {
    size_t comma = value.find(',', start);
    if (comma == std::string::npos) comma = value.size();
    const std::string item = value.substr(start, comma - start);
    start = comma + 1;
    int tasks = 0, repeat = 1;
    const size_t paren = item.find('(');
    if (paren == std::string::npos) {
      tasks = parse_int(entry, item);
    } else {
      ACCRUE_CHECK(
          item.size() > paren + 3 && item.compare(paren, 2, "(x") == 0 && item.back() == ')',
          "discover_rank: ", name, "='", value, "' is not a list like '4(x2),3'");
      tasks = parse_int(entry, item.substr(0, paren));
      repeat = parse_int(entry, item.substr(paren + 2, item.size() - paren - 3));
    }
    runs.emplace_back(tasks, repeat);
  }
  if (node < 0) {
    for (const auto& run : runs)
      ACCRUE_CHECK(run.first == runs[0].first, "discover_rank: ", name, "='", value,
                   "' differs between nodes and SLURM_NODEID is not set");
    return runs[0].first;
  }
  int first_node = 0;
  for (const auto& [tasks, repeat] : runs) {
    if (node < first_node + repeat) return tasks;
    first_node += repeat;
  }
  ACCRUE_FAIL("discover_rank: SLURM_NODEID=", node, " is beyond the ", first_node, " nodes of ",
              name, "='", value, "'");
}

// Slurm is recognised by SLURM_PROCID alone (srun sets it per task):
// SLURM_NTASKS and SLURM_LOCALID without it describe an allocation (a salloc
// shell), not a launch, and must not turn a plain run into an error.
std::optional<LauncherSet> read_slurm(const Env& env) {
  auto present = first_present(env, {"SLURM_PROCID"});
  if (!present) return std::nullopt;
  const char* launcher = "slurm";
  LauncherSet s;
  s.launcher = launcher;
  s.rank = require_int(env, launcher, "SLURM_PROCID", *present);
  s.world_size = require_int(env, launcher, "SLURM_NTASKS", *present);
  s.local_rank = require_int(env, launcher, "SLURM_LOCALID", *present);
  const char* local_world = "SLURM_NTASKS_PER_NODE";
  if (auto per_node = lookup(env, "SLURM_NTASKS_PER_NODE")) {
    s.local_world_size = parse_int(local_world, *per_node);
  } else if (auto tasks = lookup(env, "SLURM_TASKS_PER_NODE")) {
    local_world = "SLURM_TASKS_PER_NODE";
    auto node = lookup(env, "SLURM_NODEID");
    s.local_world_size = slurm_tasks_on_node(*tasks, node ? parse_int("SLURM_NODEID", *node) : -1);
  } else {
    ACCRUE_FAIL("discover_rank: slurm variable ", *present,
                " is set but neither SLURM_NTASKS_PER_NODE nor SLURM_TASKS_PER_NODE is");
  }
  check_ranges(s, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", local_world);
  s.summary = summarize("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", local_world, s);
  return s;
}

// See Note [Launcher precedence]: `outer` started `inner`'s processes either
// one by one or one inner launcher per node.
void check_nesting(const LauncherSet& inner, const LauncherSet& outer) {
  const bool same = outer.rank == inner.rank && outer.world_size == inner.world_size &&
                    outer.local_rank == inner.local_rank &&
                    outer.local_world_size == inner.local_world_size;
  const int per = inner.local_world_size;
  const bool per_node = inner.world_size % per == 0 && outer.rank == inner.rank / per &&
                        outer.world_size == inner.world_size / per;
  ACCRUE_CHECK(same || per_node, "discover_rank: the ", inner.launcher, " and ", outer.launcher,
               " variables disagree (", inner.summary, " vs ", outer.summary,
               "); a stale export of one of them?");
}

}  // namespace

RankInfo discover_rank(const Env& env) {
  auto torchrun = read_set(env, "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  auto openmpi = read_set(env, "openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                          "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE");
  auto slurm = read_slurm(env);
  if (torchrun && openmpi) check_nesting(*torchrun, *openmpi);

  RankInfo info;
  const std::optional<LauncherSet>& chosen = torchrun ? torchrun : openmpi ? openmpi : slurm;
  if (chosen) {
    info.rank = chosen->rank;
    info.world_size = chosen->world_size;
    info.local_rank = chosen->local_rank;
    info.local_world_size = chosen->local_world_size;
    info.launcher = chosen->launcher;
  } else {
    info.launcher = "none";
  }
  if (auto addr = lookup(env, "MASTER_ADDR")) info.master_addr = *addr;
  if (auto port = lookup(env, "MASTER_PORT")) {
    info.master_port = parse_int("MASTER_PORT", *port);
    ACCRUE_CHECK(info.master_port >= 1 && info.master_port <= 65535,
                 "discover_rank: MASTER_PORT=", *port, " is not a port (1..65535)");
  }
  return info;
}

RankInfo discover_rank() {
  // Only the variables discover_rank reads: the environment may hold secrets.
  static const char* const kNames[] = {"RANK",
                                       "WORLD_SIZE",
                                       "LOCAL_RANK",
                                       "LOCAL_WORLD_SIZE",
                                       "MASTER_ADDR",
                                       "MASTER_PORT",
                                       "OMPI_COMM_WORLD_RANK",
                                       "OMPI_COMM_WORLD_SIZE",
                                       "OMPI_COMM_WORLD_LOCAL_RANK",
                                       "OMPI_COMM_WORLD_LOCAL_SIZE",
                                       "SLURM_PROCID",
                                       "SLURM_NTASKS",
                                       "SLURM_LOCALID",
                                       "SLURM_NODEID",
                                       "SLURM_NTASKS_PER_NODE",
                                       "SLURM_TASKS_PER_NODE"};
  Env env;
  for (const char* name : kNames)
    if (const char* value = std::getenv(name)) env[name] = value;
  return discover_rank(env);
}

std::string describe(const RankInfo& info) {
  std::string s =
      detail::str_cat("rank ", info.rank, " of ", info.world_size, " (local ", info.local_rank,
                      " of ", info.local_world_size, ") via ", info.launcher);
  if (!info.master_addr.empty() || info.master_port != 0)
    s += detail::str_cat(", master ", info.master_addr.empty() ? "?" : info.master_addr, ":",
                         info.master_port);
  return s;
}

}  // namespace accrue::dist
