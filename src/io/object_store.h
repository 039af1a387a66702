// Object-storage I/O: S3-compatible buckets (s3://bucket/key) and plain HTTP(S) URLs, read through
// libcurl's multi interface (one thread drives every transfer; connections are reused and many
// requests are in flight at once). S3 requests are signed by libcurl (CURLOPT_AWS_SIGV4).
//
// The readers (WebDataset, Parquet, records) read through ObjectStore: size() (HEAD), list()
// (ListObjectsV2, S3 only), read() (one range GET, blocking), submit_read() (the same, returning a
// future: many in flight), and open() for a sequential read of a whole object (ranges fetched
// ahead). Transient faults are retried (retry_delay, is_retryable_status); a body cut short is
// resumed from the byte where it stopped, so each byte lands in the caller's buffer once.
// docs/storage.md describes the URL forms, the settings and the faults.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace stoker::io {

// ---- URLs ---------------------------------------------------------------------------------------

struct ObjectUrl {
  enum class Scheme { kS3, kHttp };
  Scheme scheme = Scheme::kHttp;
  std::string bucket;  // s3 only
  std::string key;     // s3 only: the key or the prefix (may be empty)
  std::string url;     // as given
};

// Parses "s3://bucket/key" or "http(s)://...". Throws std::invalid_argument for anything else
// (a missing bucket name included).
ObjectUrl parse_object_url(std::string_view url);

// ---- settings -----------------------------------------------------------------------------------

// Explicit settings: each one given overrides the environment and the shared files.
struct S3Overrides {
  std::optional<std::string> access_key_id;
  std::optional<std::string> secret_access_key;
  std::optional<std::string> session_token;
  std::optional<std::string> region;
  std::optional<std::string> endpoint;  // "http://127.0.0.1:8333": path-style addressing
  std::optional<std::string> profile;
};

struct S3Settings {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // empty: none
  std::string region = "us-east-1";
  std::string endpoint;  // empty: https://BUCKET.s3.REGION.amazonaws.com (virtual-hosted)
  std::string profile = "default";
  bool anonymous() const { return access_key_id.empty(); }
};

// The settings from an environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN,
// AWS_REGION / AWS_DEFAULT_REGION, AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, AWS_PROFILE) and the
// contents of the shared credentials and config files (INI; "[name]" sections in credentials,
// "[profile name]" or "[default]" in config; either may be empty), with `overrides` first.
// Precedence for each value: override, environment, credentials file (keys only), config file.
// Keys from the environment are used only as a pair; a profile named by AWS_PROFILE or the
// override that neither file has is an error (std::invalid_argument). Pure: no I/O.
S3Settings resolve_s3_settings(const std::map<std::string, std::string>& env,
                               std::string_view credentials_file, std::string_view config_file,
                               const S3Overrides& overrides = {});

// resolve_s3_settings over this process's environment and the files it names
// (AWS_SHARED_CREDENTIALS_FILE, AWS_CONFIG_FILE; by default ~/.aws/credentials, ~/.aws/config).
S3Settings load_s3_settings(const S3Overrides& overrides = {});

// The HTTP URL of a bucket and of an object: path-style under the endpoint when one is set
// (ENDPOINT/BUCKET/KEY), else virtual-hosted AWS (https://BUCKET.s3.REGION.amazonaws.com/KEY);
// the key percent-encoded once, '/' kept (SigV4's canonical form).
std::string s3_bucket_url(const S3Settings& settings, const std::string& bucket);
std::string s3_object_url(const S3Settings& settings, const std::string& bucket,
                          const std::string& key);

// ---- proxies ------------------------------------------------------------------------------------

// The proxies libcurl would take from the environment, as libcurl reads them: `http_proxy`
// (lower case only) for http URLs, `https_proxy` or `HTTPS_PROXY` for https ones, else
// `all_proxy` / `ALL_PROXY`; the hosts in `no_proxy` / `NO_PROXY` go direct. Empty: none.
// A store reads them once, when it is made, and gives them to every request: left to libcurl,
// they are read again for each request on the store's thread, where a getenv races with a
// setenv elsewhere in the process (a fixture's or a training script's os.environ: glibc may
// free the array being read; the likely death of a CI run's test process). A redirect keeps
// the proxy of the URL asked for.
struct ProxySettings {
  std::string http;
  std::string https;
  std::string no_proxy;
  bool operator==(const ProxySettings&) const = default;
};

// From an environment (pure).
ProxySettings resolve_proxy_settings(const std::map<std::string, std::string>& env);
// From this process's environment, now.
ProxySettings load_proxy_settings();

// ---- retries ------------------------------------------------------------------------------------

struct RetryPolicy {
  int max_attempts = 6;        // tries in all, the first included
  double base_delay_s = 0.05;  // the cap of the first retry's delay
  double max_delay_s = 5.0;    // no delay is longer
};

// The delay before retry number `retry` (1 for the first retry): full jitter,
// uniform01 * min(max_delay_s, base_delay_s * 2^(retry-1)), with uniform01 in [0, 1).
double retry_delay(const RetryPolicy& policy, int retry, double uniform01);

// Whether an HTTP status is transient: 408, 429 (and S3's SlowDown, a 503), 5xx but 501.
bool is_retryable_status(long status);

// ---- errors and counters ------------------------------------------------------------------------

class ObjectStoreError : public std::runtime_error {
 public:
  enum class Kind {
    kNotFound,      // 404: no such bucket or object (not retried)
    kAccessDenied,  // 401/403: wrong or missing credentials, or no permission (not retried)
    kRange,         // the range lies beyond the object's end (not retried)
    kClient,        // another 4xx, a DNS failure, an unsupported operation (not retried)
    kExhausted,     // a transient fault persisted through every retry
  };
  ObjectStoreError(Kind kind, std::string url, long http_status, std::string s3_code,
                   const std::string& message)
      : std::runtime_error(message),
        kind_(kind),
        url_(std::move(url)),
        http_status_(http_status),
        s3_code_(std::move(s3_code)) {}
  Kind kind() const { return kind_; }
  const std::string& url() const { return url_; }
  long http_status() const { return http_status_; }  // 0: no HTTP response
  const std::string& s3_code() const { return s3_code_; }

 private:
  Kind kind_;
  std::string url_;
  long http_status_;
  std::string s3_code_;
};

// A snapshot of the counters (each attempt of a request counts as a request).
struct IoStats {
  std::uint64_t list_requests = 0;
  std::uint64_t head_requests = 0;
  std::uint64_t get_requests = 0;
  std::uint64_t put_requests = 0;
  std::uint64_t bytes_fetched = 0;   // body bytes delivered to callers (each once)
  std::uint64_t retries = 0;         // attempts after a transient fault
  std::uint64_t resumed_bodies = 0;  // retries that went on from a byte past the range's start
  std::uint64_t failures = 0;        // requests that ended with an error
  std::uint64_t connections = 0;     // connections opened (the rest of the requests reused one)
  std::uint64_t cache_hits = 0;      // ranges served by the disk cache (no request)
  std::uint64_t cache_hit_bytes = 0;
};

// ---- the store ----------------------------------------------------------------------------------

struct ObjectInfo {
  std::string url;  // s3://bucket/key
  std::string key;
  std::uint64_t size = 0;
  std::string etag;
};

struct ObjectStoreOptions {
  S3Overrides s3;  // over the environment and ~/.aws (load_s3_settings)
  RetryPolicy retry;
  int max_in_flight = 128;  // transfers running at once; more wait their turn (Priority)
  double connect_timeout_s = 10;
  // A transfer that moves no byte for this long is aborted (and retried).
  double stall_timeout_s = 30;
  // A local disk cache of the ranges read (read() and open(); not submit_read()): a directory
  // and its byte cap, least recently used first out (disk_cache.h). Empty: none.
  std::string cache_dir;
  std::uint64_t cache_bytes = 10ull << 30;
  std::size_t stream_chunk = 8u << 20;  // open(): the size of each range fetched ahead
  int stream_depth = 4;                 // open(): ranges in flight ahead of the reader
};

class ObjectReader;
class DiskCache;

// Thread safety: every member may be called from any thread at once; one internal thread runs
// the transfers. Futures from submit_read() must be waited for (or dropped) before the buffer
// they write goes away; destroying the store fails what is still pending.
class ObjectStore {
 public:
  explicit ObjectStore(ObjectStoreOptions options = {});
  ObjectStore(S3Settings settings, ObjectStoreOptions options);
  ~ObjectStore();
  ObjectStore(const ObjectStore&) = delete;
  ObjectStore& operator=(const ObjectStore&) = delete;

  const S3Settings& settings() const;

  // The object's size in bytes (HEAD).
  std::uint64_t size(const std::string& url);
  // The object's size and ETag (one HEAD; the ETag is empty when the server sends none).
  ObjectInfo head(const std::string& url);
  // Every object under an s3:// prefix, in key order (ListObjectsV2, pages followed through
  // their continuation tokens). An http(s) URL has no listing: ObjectStoreError kClient.
  std::vector<ObjectInfo> list(const std::string& prefix_url);
  // Reads bytes [offset, offset + length) of the object into dst (one range GET, retried and
  // resumed as needed; from the disk cache where it has the range). Throws ObjectStoreError.
  void read(const std::string& url, std::uint64_t offset, std::size_t length, std::byte* dst);
  // The same, asynchronous: the future is ready when all bytes are in dst (or holds the error).
  // kNow reads (and every blocking call, and every retry) start before kAhead ones, which start
  // in the order submitted: a fetch ahead of its readers is kAhead, so a reader that waits now
  // never queues behind hundreds of them. `on_done`, when given, is called on the store's thread
  // once the future is ready (also when the store closes); it must be quick and must not call
  // the store.
  enum class Priority { kNow, kAhead };
  std::future<void> submit_read(const std::string& url, std::uint64_t offset, std::size_t length,
                                std::byte* dst, Priority priority = Priority::kNow,
                                std::function<void()> on_done = {});
  // A sequential reader of the whole object.
  std::unique_ptr<ObjectReader> open(const std::string& url);

  // Writes an object (one PUT of `data`, retried like a read); for tests and tools: with
  // libcurl 7.88 the payload is signed as empty, which SeaweedFS takes and AWS would not.
  void put(const std::string& url, std::string_view data);
  // Creates an S3 bucket (PUT on the bucket); not an error if this account owns it already.
  void create_bucket(const std::string& bucket);

  IoStats stats() const;
  // The disk cache (null without ObjectStoreOptions::cache_dir).
  DiskCache* cache();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Reads a whole object in order: stream_depth ranges of stream_chunk bytes are fetched ahead of
// the caller (so memory stays at depth * chunk), each retried and resumed like read(). Destroy
// it before its store; one thread at a time.
class ObjectReader {
 public:
  ObjectReader(ObjectStore& store, std::string url, std::uint64_t size, std::size_t chunk,
               int depth);
  ~ObjectReader();
  ObjectReader(const ObjectReader&) = delete;
  ObjectReader& operator=(const ObjectReader&) = delete;

  std::uint64_t size() const { return size_; }
  // Copies up to n bytes into dst; returns how many (0 at the end). Throws ObjectStoreError.
  std::size_t read(std::byte* dst, std::size_t n);

 private:
  struct Chunk {
    std::uint64_t offset = 0;
    std::vector<std::byte> data;
    std::future<void> done;  // invalid when served by the cache
    bool fetched = false;    // fetched (and to be stored in the cache once read)
  };
  void fill();

  ObjectStore& store_;
  std::string url_;
  std::uint64_t size_;
  std::size_t chunk_;
  int depth_;
  std::uint64_t next_fetch_ = 0;               // the offset of the next range to submit
  std::size_t pos_in_front_ = 0;               // bytes of the front chunk already returned
  std::vector<std::unique_ptr<Chunk>> ahead_;  // in offset order
  std::exception_ptr error_;                   // a failed range fails every later read
};

}  // namespace stoker::io
