// `specloop buffer stats|export|verify DIR`: inspecting a replay buffer (DESIGN.md section 1);
// `specloop buffer repair DIR --out NEW`: salvaging a damaged one;
// `specloop buffer ship|ingest`: moving records through a Redis stream (many workers).
#include <signal.h>

#include <atomic>
#include <ctime>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>

#include <CLI/CLI.hpp>

#include "cli/buffer_command.h"

#include "buffer/buffer_tools.h"
#include "fleet/record_shipper.h"
#include "fleet/stream_ingester.h"
#include "fleet/stream_metrics.h"
#include "common/base/clock.h"
#include "common/observe/process_metrics.h"

namespace specloop {

namespace {

std::string FormatTime(uint64_t us) {
  const std::time_t t = static_cast<std::time_t>(us / 1000000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::ostringstream o;
  o << std::put_time(&tm, "%Y-%m-%dT%H:%M:%SZ");
  return o.str();
}

// Unix seconds ("1700000000", "1700000000.5") or UTC ISO 8601 ("2024-05-01T12:00:00Z",
// "2024-05-01"). False when neither.
bool ParseSince(const std::string& s, uint64_t* us) {
  try {
    size_t used = 0;
    const double secs = std::stod(s, &used);
    if (used == s.size() && secs >= 0) {
      *us = static_cast<uint64_t>(secs * 1e6);
      return true;
    }
  } catch (const std::exception&) {
  }
  for (const char* fmt : {"%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d"}) {
    std::tm tm{};
    std::istringstream in(s);
    in >> std::get_time(&tm, fmt);
    if (!in.fail() && in.peek() == std::char_traits<char>::eof()) {
      *us = static_cast<uint64_t>(timegm(&tm)) * 1000000ull;
      return true;
    }
  }
  return false;
}

int RunStats(const std::string& dir) {
  BufferStats st;
  Status s = ComputeBufferStats(dir, &st);
  if (!s.ok()) {
    std::cerr << "specloop buffer stats: " << s.ToString() << "\n";
    return 1;
  }
  std::cout << "records        " << st.records << "\n"
            << "steps          " << st.steps << "\n"
            << "record bytes   " << st.value_bytes << "\n"
            << "disk bytes     " << st.disk_bytes << "\n"
            << "bytes/record   " << (st.records ? st.value_bytes / st.records : 0) << "\n";
  if (st.records > 0) {
    std::cout << "time span      " << FormatTime(st.min_time_us) << " .. "
              << FormatTime(st.max_time_us) << " ("
              << (st.max_time_us - st.min_time_us) / 1e6 << " s)\n";
  }
  std::cout << "domains\n";
  for (const auto& [d, n] : st.domains) std::cout << "  " << (d.empty() ? "\"\"" : d) << " " << n << "\n";
  std::cout << "draft versions\n";
  for (const auto& [v, n] : st.draft_versions) std::cout << "  v" << v << " " << n << "\n";
  if (st.damaged()) {
    std::cout << "corrupt        " << st.corrupt << " (records that do not decode, skipped)\n"
              << "damaged blocks " << st.damaged_block_records
              << " records lost in damaged SST blocks (skipped)\n";
    if (st.wal_damaged) {
      std::cout << "damaged WAL    " << st.damaged_wal_records
                << " records lost with damaged WAL records (skipped)\n";
    }
    for (const auto& f : st.damaged_files) std::cout << "  damaged " << f << "\n";
    std::cout << "run `specloop buffer verify` for details, `specloop buffer repair` to copy "
                 "the intact records out\n";
    return 1;
  }
  return 0;
}

int RunExport(const std::string& dir, const std::string& format, const std::string& domain,
              const std::string& since) {
  if (format != "jsonl") {
    std::cerr << "specloop buffer export: unknown format " << format << " (jsonl)\n";
    return 2;
  }
  ExportOptions opt;
  if (!domain.empty()) opt.domain = domain;
  if (!since.empty() && !ParseSince(since, &opt.since_us)) {
    std::cerr << "specloop buffer export: --since wants Unix seconds or YYYY-MM-DD[THH:MM:SSZ]\n";
    return 2;
  }
  uint64_t n = 0;
  Status s = ExportJsonl(dir, opt, std::cout, &n);
  if (!s.ok()) {
    std::cerr << "specloop buffer export: " << s.ToString() << "\n";
    return 1;
  }
  std::cerr << n << " records exported\n";
  return 0;
}

int RunVerify(const std::string& dir) {
  VerifyReport r;
  Status s = VerifyBuffer(dir, &r);
  std::cout << "records " << r.records << ", corrupt " << r.corrupt_records << ", bad keys "
            << r.bad_keys << ", index entries " << r.index_entries << ", dangling index "
            << r.dangling_index << ", unindexed " << r.unindexed_records
            << ", lost in damaged blocks " << r.damaged_block_records << " records / "
            << r.damaged_index_entries << " index entries, lost in the WAL "
            << r.damaged_wal_records << "\n";
  for (const auto& f : r.damaged_files) {
    std::cout << "damaged file " << f.file << " (" << f.column_family << "): " << f.lost()
              << " of " << f.entries << " entries lost"
              << (f.unopenable ? " (unreadable)" : "") << "\n";
  }
  for (const auto& p : r.problems) std::cout << "  " << p << "\n";
  if (!s.ok()) {
    std::cerr << "specloop buffer verify: " << s.ToString() << "\n";
    return 1;
  }
  std::cout << "OK\n";
  return 0;
}

int RunRepair(const std::string& dir, const std::string& out) {
  RepairReport r;
  Status s = RepairBuffer(dir, out, &r);
  if (!s.ok()) {
    std::cerr << "specloop buffer repair: " << s.ToString() << "\n";
    return s.IsInvalidArgument() ? 2 : 1;
  }
  std::cout << "copied " << r.copied << " records to " << out << "; skipped "
            << r.damaged_block_records << " in damaged blocks, " << r.undecodable
            << " that do not decode, " << r.damaged_wal_records << " lost in the WAL\n";
  for (const auto& f : r.damaged_files) std::cout << "  damaged " << f << "\n";
  return 0;
}

// ship and ingest run until SIGINT or SIGTERM.
std::atomic<bool> g_stop{false};
void OnStop(int) { g_stop = true; }
void StopOnSignals() {
  struct sigaction sa = {};
  sa.sa_handler = OnStop;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

// --metrics-host/--metrics-port of ship and ingest (port 0: no endpoint).
struct MetricsAddress {
  std::string host = "127.0.0.1";
  int port = 0;
};

int RunShip(ShipperOptions o, const std::string& redis, const MetricsAddress& ma) {
  if (!ParseRedisAddress(redis, &o.redis_host, &o.redis_port)) {
    std::cerr << "specloop buffer ship: --redis takes HOST:PORT\n";
    return 2;
  }
  StopOnSignals();
  const uint64_t start_us = NowMicros();
  std::unique_ptr<RecordShipper> shipper;
  Status s = RecordShipper::Open(o, &shipper);
  metrics::Registry registry;
  std::unique_ptr<ShipperMetrics> m;
  std::unique_ptr<MetricsEndpoint> endpoint;
  if (s.ok() && ma.port > 0) {
    s = AddProcessMetrics(&registry);
    if (s.ok()) s = ShipperMetrics::Create(&registry, o.id, start_us, &m);
    RecordShipper* sh = shipper.get();
    ShipperMetrics* mp = m.get();
    if (s.ok()) {
      s = MetricsEndpoint::Start(ma.host, ma.port, &registry,
                                 [sh, mp] { mp->Update(sh->stats(), NowMicros()); }, &endpoint);
    }
  }
  if (!s.ok()) {
    std::cerr << "specloop buffer ship: " << s.ToString() << "\n";
    return 1;
  }
  std::cout << "specloop buffer ship: " << o.buffer_dir << " -> " << redis << " " << o.stream
            << " (position " << shipper->position_key() << ": seq " << shipper->position_seq()
            << ")"
            << (ma.port > 0 ? ", metrics on http://" + ma.host + ":" + std::to_string(ma.port) +
                                  "/metrics"
                            : std::string())
            << std::endl;
  shipper->Run(g_stop);
  const ShipperStats& st = shipper->stats();
  std::cout << "specloop buffer ship: shipped " << st.records << " records (" << st.bytes
            << " bytes) in " << st.batches << " transactions, " << st.dropped
            << " stream entries dropped by the cap, " << st.errors << " errors" << std::endl;
  endpoint.reset();  // stops serving before the stats it reads go
  return 0;
}

int RunIngest(IngesterOptions o, const std::string& redis, const MetricsAddress& ma) {
  if (!ParseRedisAddress(redis, &o.redis_host, &o.redis_port)) {
    std::cerr << "specloop buffer ingest: --redis takes HOST:PORT\n";
    return 2;
  }
  StopOnSignals();
  std::unique_ptr<StreamIngester> ingester;
  Status s = StreamIngester::Open(o, &ingester);
  metrics::Registry registry;
  std::unique_ptr<IngesterMetrics> m;
  std::unique_ptr<MetricsEndpoint> endpoint;
  if (s.ok() && ma.port > 0) {
    s = AddProcessMetrics(&registry);
    if (s.ok()) s = IngesterMetrics::Create(&registry, o.group, &m);
    StreamIngester* in = ingester.get();
    IngesterMetrics* mp = m.get();
    if (s.ok()) {
      s = MetricsEndpoint::Start(ma.host, ma.port, &registry,
                                 [in, mp] { mp->Update(in->stats(), NowMicros()); }, &endpoint);
    }
  }
  if (!s.ok()) {
    std::cerr << "specloop buffer ingest: " << s.ToString() << "\n";
    return 1;
  }
  std::cout << "specloop buffer ingest: " << redis << " " << o.stream << " (group " << o.group
            << ", consumer " << o.consumer << ") -> " << o.buffer_dir
            << (ma.port > 0 ? ", metrics on http://" + ma.host + ":" + std::to_string(ma.port) +
                                  "/metrics"
                            : std::string())
            << std::endl;
  ingester->Run(g_stop);
  const IngesterStats& st = ingester->stats();
  std::cout << "specloop buffer ingest: " << st.records << " records, " << st.corrupt
            << " corrupt entries skipped, " << st.missing << " missing (trimmed), " << st.trimmed
            << " acknowledged entries trimmed, " << st.errors << " errors" << std::endl;
  endpoint.reset();
  return 0;
}

}  // namespace

void AddBufferCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("buffer", "inspect a replay buffer directory, or ship its records");
  cmd->require_subcommand(1);

  auto stats_dir = std::make_shared<std::string>();
  auto* stats = cmd->add_subcommand("stats", "records, bytes, domains, time span, draft versions");
  stats->add_option("dir", *stats_dir, "buffer directory")->required();
  stats->callback([stats_dir, exit_code] { *exit_code = RunStats(*stats_dir); });

  struct ExportArgs {
    std::string dir, format = "jsonl", domain, since;
  };
  auto ea = std::make_shared<ExportArgs>();
  auto* exp = cmd->add_subcommand("export", "write records as JSON lines to stdout");
  exp->add_option("dir", ea->dir, "buffer directory")->required();
  exp->add_option("--format", ea->format, "output format (jsonl)");
  exp->add_option("--domain", ea->domain, "only this domain");
  exp->add_option("--since", ea->since, "only records at or after (Unix seconds or ISO date)");
  exp->callback([ea, exit_code] {
    *exit_code = RunExport(ea->dir, ea->format, ea->domain, ea->since);
  });

  auto verify_dir = std::make_shared<std::string>();
  auto* verify = cmd->add_subcommand(
      "verify", "check every block and record; name damaged files and records");
  verify->add_option("dir", *verify_dir, "buffer directory")->required();
  verify->callback([verify_dir, exit_code] { *exit_code = RunVerify(*verify_dir); });

  auto repair_dirs = std::make_shared<std::pair<std::string, std::string>>();
  auto* repair = cmd->add_subcommand(
      "repair", "copy every intact record into a new buffer, stepping over damage");
  repair->add_option("dir", repair_dirs->first, "damaged buffer directory (only read)")
      ->required();
  repair->add_option("--out", repair_dirs->second, "new buffer directory (must not exist)")
      ->required();
  repair->callback([repair_dirs, exit_code] {
    *exit_code = RunRepair(repair_dirs->first, repair_dirs->second);
  });

  auto redis = std::make_shared<std::string>("127.0.0.1:6379");
  auto so = std::make_shared<ShipperOptions>();
  auto* ship = cmd->add_subcommand(
      "ship", "append a local buffer's records to a Redis stream, following it until stopped");
  ship->add_option("dir", so->buffer_dir, "buffer directory (a worker's --buffer)")->required();
  ship->add_option("--redis", *redis, "Redis server, HOST:PORT")->capture_default_str();
  ship->add_option("--stream", so->stream, "stream name")->capture_default_str();
  ship->add_option("--id", so->id, "this shipper's name (its position in Redis); one per buffer")
      ->required();
  ship->add_option("--max-stream-length", so->max_stream_length,
                   "the stream's cap, entries: beyond it the oldest are dropped even if not yet "
                   "acknowledged (counted in specloop_stream_dropped_entries_total; 0: none)")
      ->capture_default_str();
  auto ship_ma = std::make_shared<MetricsAddress>();
  ship->add_option("--metrics-host", ship_ma->host, "bind address of /metrics")
      ->capture_default_str();
  ship->add_option("--metrics-port", ship_ma->port, "port of /metrics (0: none)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  ship->callback([so, redis, ship_ma, exit_code] { *exit_code = RunShip(*so, *redis, *ship_ma); });

  auto io = std::make_shared<IngesterOptions>();
  auto* ingest = cmd->add_subcommand(
      "ingest", "write a Redis stream's records into a local buffer (for `specloop train`)");
  ingest->add_option("dir", io->buffer_dir, "buffer directory to write")->required();
  ingest->add_option("--redis", *redis, "Redis server, HOST:PORT")->capture_default_str();
  ingest->add_option("--stream", io->stream, "stream name")->capture_default_str();
  ingest->add_option("--group", io->group, "consumer group")->capture_default_str();
  ingest->add_option("--consumer", io->consumer, "this consumer's name in the group")
      ->capture_default_str();
  ingest->add_option("--trim-seconds", io->trim_seconds,
                     "how often to trim the entries every consumer group acknowledged, and read "
                     "the lag (0: never)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  auto ingest_ma = std::make_shared<MetricsAddress>();
  ingest->add_option("--metrics-host", ingest_ma->host, "bind address of /metrics")
      ->capture_default_str();
  ingest->add_option("--metrics-port", ingest_ma->port, "port of /metrics (0: none)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  ingest->callback([io, redis, ingest_ma, exit_code] {
    *exit_code = RunIngest(*io, *redis, *ingest_ma);
  });
}

}  // namespace specloop
