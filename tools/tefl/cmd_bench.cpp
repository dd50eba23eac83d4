// tefl bench [--op OP] [--impl ID] [--dtype] [--size|--shape SHAPE] [--json]
// [--plot FILE.png]: per op x implementation, the time of one call on warm,
// preallocated outputs, its GB/s (bytes of every input and output) and that
// as a percentage of this machine's copy bandwidth, measured at the start
// of the run with the same threads: memcpy's, and (x86) a copy that writes
// with non-temporal stores, the roofline of a kernel that streams its output.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "backends/portable/cpu_paths.h"
#include "check/cases.h"
#include "check/runner.h"
#include "cli_support.h"
#include "core/thread_pool.h"

namespace tefl::cli {
namespace {

using Clock = std::chrono::steady_clock;

// Median seconds per call of fn, sampled for at least min_time seconds.
template <class Fn>
double MedianSeconds(Fn&& fn, double min_time) {
  std::vector<double> samples;
  const auto start = Clock::now();
  while (samples.size() < 3 || std::chrono::duration<double>(Clock::now() - start).count() < min_time) {
    const auto t0 = Clock::now();
    fn();
    samples.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    if (samples.size() >= 1000) break;
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

// Copy bandwidth (bytes read + written per second) over 256 MiB, 64 KiB
// blocks over the host pool. kMemcpy: glibc's memcpy (at 64 KiB it stores
// through the cache, so every destination line is also read for ownership).
// kStreaming: 16-byte loads and non-temporal stores (no read for ownership),
// what the portable kernels do for outputs of 32 MiB and more.
enum class CopyKind { kMemcpy, kStreaming };

void StreamingCopy(char* dst, const char* src, size_t n) {
#if defined(__SSE2__)
  for (size_t i = 0; i < n; i += 64) {
    const __m128i a = _mm_load_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_load_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_load_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_load_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  _mm_sfence();
#else
  std::memcpy(dst, src, n);
#endif
}

// Whether this build can measure the streaming copy (else it is not reported).
constexpr bool kHaveStreamingCopy =
#if defined(__SSE2__)
    true;
#else
    false;
#endif

double MeasureCopyBandwidth(double min_time, CopyKind kind) {
  const size_t bytes = size_t(256) << 20;
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, Free> src(static_cast<char*>(std::aligned_alloc(64, bytes)));
  std::unique_ptr<char, Free> dst(static_cast<char*>(std::aligned_alloc(64, bytes)));
  std::memset(src.get(), 1, bytes);
  std::memset(dst.get(), 0, bytes);
  const int64_t blocks = int64_t(bytes / 65536);
  const double s = MedianSeconds(
      [&] {
        ParallelFor(blocks, 1, [&](int64_t b, int64_t e) {
          char* d = dst.get() + b * 65536;
          const char* from = src.get() + b * 65536;
          const size_t n = size_t(e - b) * 65536;
          if (kind == CopyKind::kStreaming) {
            StreamingCopy(d, from, n);
          } else {
            std::memcpy(d, from, n);
          }
        });
      },
      min_time);
  return 2.0 * double(bytes) / s;
}

// The benchmark shape of a family (the op's main input).
std::vector<int64_t> DefaultSize(const std::string& family) {
  if (family == "softmax") return {2, 16, 1024, 1024};
  if (family == "rope") return {2048, 2, 32, 128};
  if (family == "gemm") return {1024, 1024};            // [M, K] (N = K): 2 GFLOP
  if (family == "attention") return {2, 1024, 16, 64};  // q [b, s, h, d]
  return {4096, 4096};
}

// Families whose reference.cpp (naive loops in double) takes seconds to
// minutes per call at the default sizes: timed only when asked for by --impl.
bool ReferenceTooSlow(const std::string& family) { return family == "gemm" || family == "attention"; }

// The plot script: $TEFL_PLOT_SCRIPT, else the source tree's (a build
// tree's binary), else the installed one next to this binary
// (<prefix>/bin/tefl -> <prefix>/share/tefl/plot_bench.py).
std::string PlotScript() {
  if (const char* env = std::getenv("TEFL_PLOT_SCRIPT")) return env;
  if (access(TEFL_PLOT_SCRIPT, R_OK) == 0) return TEFL_PLOT_SCRIPT;
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    std::string path(exe, size_t(n));
    path = path.substr(0, path.rfind('/'));
    path = path.substr(0, path.rfind('/')) + "/share/tefl/plot_bench.py";
    if (access(path.c_str(), R_OK) == 0) return path;
  }
  return TEFL_PLOT_SCRIPT;  // missing: the run reports it
}

// What savefig writes without further packages (jpg, tiff, webp need Pillow).
constexpr const char* kPlotFormats[] = {"png", "pdf", "svg", "eps", "ps"};

// The checks --plot can make before anything runs: the file's format and
// directory, the script, python3 with matplotlib. Returns the script.
std::string CheckPlot(const std::string& file) {
  const size_t slash = file.rfind('/');
  const std::string name = slash == std::string::npos ? file : file.substr(slash + 1);
  const size_t dot = name.rfind('.');
  std::string ext = dot == std::string::npos || dot == 0 ? "" : name.substr(dot + 1);
  for (char& ch : ext) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  if (std::find_if(std::begin(kPlotFormats), std::end(kPlotFormats), [&](const char* f) { return ext == f; }) ==
      std::end(kPlotFormats))
    throw UsageError(fmt::format("--plot {}: {} (expected a file name ending .{})", file,
                                 ext.empty() ? std::string("no format given") : "unsupported format '." + ext + "'",
                                 fmt::join(kPlotFormats, ", .")));
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : file.substr(0, slash);
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw UsageError(fmt::format("--plot {}: the directory '{}' does not exist", file, dir));
  if (access(dir.c_str(), W_OK) != 0)
    throw UsageError(fmt::format("--plot {}: the directory '{}' is not writable", file, dir));
  const std::string script = PlotScript();
  if (access(script.c_str(), R_OK) != 0) {
    const int err = errno;
    throw CliError(fmt::format("--plot: the plot script '{}'{} cannot be read: {}", script,
                               std::getenv("TEFL_PLOT_SCRIPT") ? " (TEFL_PLOT_SCRIPT)" : "", std::strerror(err)));
  }
  // python3 and matplotlib, or the chart would fail after the whole run.
  std::string output;
  int rc = -1;
  if (FILE* pipe = popen("python3 -c 'import matplotlib' 2>&1", "r")) {
    char buf[512];
    while (std::fgets(buf, sizeof(buf), pipe)) output += buf;
    rc = pclose(pipe);
  }
  if (rc != 0) {
    while (!output.empty() && (output.back() == '\n' || output.back() == ' ')) output.pop_back();
    const size_t nl = output.rfind('\n');
    throw CliError(fmt::format("--plot needs python3 with matplotlib: {}",
                               output.empty() ? "python3 did not run" : output.substr(nl + 1)));
  }
  return script;
}

}  // namespace

void AddBenchCommand(CLI::App& app) {
  struct Args {
    std::vector<std::string> plugins, ops, impls;
    std::string dtype = "fp32", size, plot;
    double min_time = 0.3;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Time each op x implementation; GB/s and % of this machine's copy bandwidth measured in the same run");
  AddPluginOption(cmd, &args->plugins);
  cmd->add_option("--op", args->ops, "Only this op (repeatable); default: every op with a built-in call");
  cmd->add_option("--impl", args->impls, "Only this implementation id (repeatable: side by side in one run)");
  cmd->add_option("--dtype", args->dtype, "Data dtype: fp32, bf16, fp16")->capture_default_str();
  CLI::Option* size_opt =
      cmd->add_option("--size,--shape", args->size,
                      "Shape of the main input (gated activations: [N.., H], their input being [N.., 2H]; default "
                      "per family: 4096,4096; softmax 2,16,1024,1024; rope 2048,2,32,128; gemm 1024,1024 (M,K; N = "
                      "K); attention 2,1024,16,64 (b,s,h,d))");
  cmd->add_option("--min-time", args->min_time, "Seconds sampled per measurement")->capture_default_str();
  cmd->add_flag("--json", args->json, "Print JSON");
  cmd->add_option("--plot", args->plot, "Also draw a roofline-style chart (needs python3 with matplotlib)")
      ->type_name("FILE.png");
  cmd->callback([args, size_opt] {
    // The arguments first: bad usage is reported before any plugin loads.
    const DType dtype = ParseDType(args->dtype);
    std::optional<std::vector<int64_t>> size;
    if (size_opt->count() > 0) size = ParseShape(args->size);  // given empty: an error
    const double min_time = ValidateMinTime(args->min_time);
    std::vector<const OpSchema*> ops = RequireOps(args->ops);
    const std::string plot_script = args->plot.empty() ? "" : CheckPlot(args->plot);
    const bool ops_requested = !ops.empty();
    if (ops.empty())
      for (const OpSchema& op : AllOps())
        if (op.name) ops.push_back(&op);
    GetDefaultManager().EnsureInitialized();
    LoadPluginsOrThrow(args->plugins);
    RequireImplIds(args->impls);

    const double copy_bps = MeasureCopyBandwidth(min_time, CopyKind::kMemcpy);
    const double stream_bps = kHaveStreamingCopy ? MeasureCopyBandwidth(min_time, CopyKind::kStreaming) : 0;
    const bool progress = StderrIsTerminal() && !args->json;
    nlohmann::json rows = nlohmann::json::array();
    Table t({"op", "impl", "dtype", "shape", "time", "GB/s", "% of copy", "% of NT copy", "note"});
    // Rows asked for that could not be run: the table shows each with its
    // reason, and the command then fails (exit status 1).
    std::vector<std::string> not_run;
    auto add_not_run = [&](const std::string& op, const std::string& impl, const std::string& dt,
                           const std::string& shape, const std::string& why) {
      t.Add({op, impl, dt, shape, "-", "-", "-", "-", "not run: " + why});
      rows.push_back({{"op", op}, {"impl", impl}, {"dtype", dt}, {"shape", shape}, {"error", why}});
      not_run.push_back(fmt::format("{} {}: {}", op, impl, why));
    };
    for (const OpSchema* op : ops) {
      check::GridOptions o;
      o.dtype = dtype;
      o.shape = size ? *size : DefaultSize(op->family);
      o.first_only = true;  // one call per op: the first case of the grid at this shape
      const std::string shape_text = check::cases_internal::ShapeString(*o.shape);
      std::vector<check::Case> cases;
      try {
        cases = check::BuiltinCases(op->name, o);
      } catch (const check::TensorAllocError& e) {
        add_not_run(op->name, "-", DTypeName(dtype), shape_text, e.what());
        continue;
      }
      if (cases.empty()) {
        // Every op when none was named: those without a built-in call are
        // not benchmarks anyone asked for.
        if (ops_requested)
          add_not_run(op->name, "-", DTypeName(dtype), shape_text,
                      fmt::format("no call with dtype {} and shape {} can be built ({} ops take --size {})",
                                  DTypeName(dtype), shape_text, op->family, ShapeForm(op->family)));
        continue;
      }
      check::Case& c = cases.front();
      size_t op_rows = 0;
      double bytes = 0;
      for (const auto& in : c.inputs)
        if (in) bytes += double(in->nbytes());
      for (size_t i = 0; i < c.outputs.size(); ++i)
        if (!c.absent(i)) bytes += double(c.outputs[i].nbytes());
      // The op's implementations in registry order, or in the order --impl
      // gave them (each once).
      std::vector<OpImpl> impls = GetDefaultRegistry().GetImplementations(op->name);
      if (!args->impls.empty()) {
        std::vector<OpImpl> given;
        for (const std::string& id : args->impls)
          for (const OpImpl& impl : impls)
            if (impl.impl_id == id &&
                std::none_of(given.begin(), given.end(), [&](const OpImpl& g) { return g.impl_id == id; }))
              given.push_back(impl);
        impls = std::move(given);
      }
      for (const OpImpl& impl : impls) {
        if (!(impl.device_mask & TEFL_DEVICE_BIT(kDLCPU))) continue;
        ++op_rows;
        if (args->impls.empty() && impl.kind == BackendImplKind::REFERENCE && ReferenceTooSlow(op->family)) {
          const std::string why = "not timed: naive loops at this size (--impl " + impl.impl_id + " times it)";
          t.Add({op->name, impl.impl_id, c.dtype, c.shape, "-", "-", "-", "-", why});
          rows.push_back({{"op", op->name}, {"impl", impl.impl_id}, {"skipped", why}});
          continue;
        }
        if (progress) {
          std::fprintf(stderr, "\r\033[K%s on %s", op->name, impl.impl_id.c_str());
          std::fflush(stderr);
        }
        const std::vector<const DLTensor*> in = c.InputPtrs();
        const std::vector<DLTensor*> out = c.OutputPtrs();
        const Status first = check::RunPinned(c.op, impl.impl_id, in, out, c.attrs_ptr());
        nlohmann::json row = {{"op", op->name},   {"impl", impl.impl_id}, {"dtype", c.dtype},
                              {"shape", c.shape}, {"bytes", bytes},       {"copy_gbps", copy_bps / 1e9}};
        if (!first.ok()) {
          add_not_run(op->name, impl.impl_id, c.dtype, c.shape, check::ImplReason(first.message()));
          continue;
        }
        // The pinned policy is built once; each sample is one call.
        SelectionPolicy pinned;
        (void)SelectionPolicy::Make("flagos", true, {{op->name, {"impl:" + impl.impl_id}}}, {}, std::nullopt, &pinned);
        PolicyContext ctx(pinned);
        OpManager& mgr = GetDefaultManager();
        const double s = MedianSeconds([&] { (void)mgr.Call(op->id, in, out, c.attrs_ptr()); }, min_time);
        const double gbps = bytes / s / 1e9;
        const double pct = 100.0 * bytes / s / copy_bps;
        row["seconds"] = s;
        row["gbps"] = gbps;
        row["pct_of_copy"] = pct;
        std::string pct_stream = "-";
        if (stream_bps > 0) {
          row["pct_of_stream_copy"] = 100.0 * bytes / s / stream_bps;
          pct_stream = fmt::format("{:.0f}%", row["pct_of_stream_copy"].get<double>());
        }
        rows.push_back(row);
        t.Add({op->name, impl.impl_id, c.dtype, c.shape,
               s < 1e-3 ? fmt::format("{:.1f} us", s * 1e6) : fmt::format("{:.3f} ms", s * 1e3),
               fmt::format("{:.1f}", gbps), fmt::format("{:.0f}%", pct), pct_stream, c.note});
      }
      // An op asked for by --op and left without a row. (With every op, only
      // a run that found nothing at all fails.)
      if (op_rows == 0 && ops_requested) {
        std::string ids;
        for (const std::string& id : args->impls) ids += (ids.empty() ? "" : ", ") + id;
        add_not_run(
            op->name, "-", c.dtype, c.shape,
            args->impls.empty() ? "no implementation of it runs on the CPU" : "not implemented on the CPU by " + ids);
      }
    }
    if (rows.empty()) not_run.push_back("nothing to run: no implementation matches the --op and --impl filters");
    if (progress) std::fprintf(stderr, "\r\033[K");
    const char* target = backends::PortableTargetName();
    nlohmann::json j = {
        {"copy_gbps", copy_bps / 1e9}, {"threads", ThreadPoolSize()}, {"portable_target", target}, {"results", rows}};
    if (stream_bps > 0) j["stream_copy_gbps"] = stream_bps / 1e9;
    if (args->json) {
      std::printf("%s\n", j.dump(2).c_str());
    } else {
      const std::string nt = stream_bps > 0
                                 ? fmt::format("; with non-temporal stores (NT copy): {:.1f} GB/s", stream_bps / 1e9)
                                 : std::string("; NT copy: not measured on this CPU");
      std::printf("copy bandwidth (parallel memcpy, 256 MiB, %s): %.1f GB/s%s; default.portable's CPU target: %s\n%s",
                  Plural(size_t(ThreadPoolSize()), "thread").c_str(), copy_bps / 1e9, nt.c_str(), target,
                  t.ToString().c_str());
    }
    if (!args->plot.empty()) {
      const std::string& script = plot_script;
      char tmpl[] = "/tmp/tefl-bench-XXXXXX";
      const int fd = mkstemp(tmpl);
      if (fd < 0) throw CliError("cannot create a temporary file for the plot data");
      const std::string data = j.dump();
      const bool wrote = write(fd, data.data(), data.size()) == ssize_t(data.size());
      close(fd);
      if (!wrote) throw CliError("cannot write the plot data");
      // The script's own messages are folded into this command's one error line.
      const std::string command = fmt::format("python3 '{}' '{}' '{}' 2>&1", script, tmpl, args->plot);
      std::string output;
      int rc = -1;
      if (FILE* pipe = popen(command.c_str(), "r")) {
        char buf[512];
        while (std::fgets(buf, sizeof(buf), pipe)) output += buf;
        rc = pclose(pipe);
      }
      unlink(tmpl);
      if (rc != 0) {
        while (!output.empty() && (output.back() == '\n' || output.back() == ' ')) output.pop_back();
        const size_t nl = output.rfind('\n');
        const std::string last = nl == std::string::npos ? output : output.substr(nl + 1);
        throw CliError(fmt::format("the plot script failed ({}): {}", script, last.empty() ? "no output" : last));
      }
      if (!args->json) std::printf("chart written to %s\n", args->plot.c_str());
    }
    if (!not_run.empty())
      throw CliError(
          fmt::format("{} could not be run; first: {}", Plural(not_run.size(), "requested row"), not_run.front()));
  });
}

}  // namespace tefl::cli
