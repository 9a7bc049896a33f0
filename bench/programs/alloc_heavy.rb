# An allocation-heavy Ruby program for `meshalloc bench speed` and `real-apps`.
#
# Usage: ruby alloc_heavy.rb SCALE          (the work is linear in SCALE)
#
# Ruby keeps its small objects in its own garbage-collected heap pages, but every string
# longer than about 23 bytes, every array longer than 3 elements and every hash table beyond
# 8 entries has a body allocated with malloc and freed when the GC sweeps its owner. So a Ruby
# web application's allocator traffic is this program's: a session store whose entries expire
# at random, templates rendered by string concatenation, arrays grown by appending, and
# threads doing the same under the global VM lock. Deterministic: prints one line with counts
# and a digest, identical under every allocator.

require "digest"

SESSIONS_PER_SCALE = 2000
PAGES_PER_SCALE = 150
ARRAYS_PER_SCALE = 100
THREADS = 2
THREAD_ITEMS_PER_SCALE = 2000

scale = (ARGV[0] || "1").to_i
rng = Random.new(2019)
digest = Digest::SHA256.new

# A session store: entries of varied size, a random half expired per round, the GC runs.
store = {}
4.times do |round|
  (SESSIONS_PER_SCALE * scale).times do |i|
    store["session-#{round}-#{i}-#{rng.rand(1 << 20)}"] =
      { "user" => "u" * rng.rand(1..600), "cart" => Array.new(rng.rand(12)) { |j| j * i } }
  end
  store.delete_if { rng.rand < 0.5 }
  GC.start
end
store.keys.sort.each_slice([store.size / 500, 1].max) { |slice| digest << slice.first }

# Templates: pages rendered by concatenation, thrown away at once.
rendered = 0
(PAGES_PER_SCALE * scale).times do |i|
  page = +"<html><body>"
  rng.rand(20..80).times do |row|
    page << "<tr><td>#{row}</td><td>#{"cell " * rng.rand(1..30)}</td></tr>"
  end
  page << "</body></html>"
  rendered += page.bytesize
  digest << page[-64, 64] if (i % 53).zero?
end

# Arrays and strings grown element by element: their bodies are realloc'ed as they grow.
grown = 0
(ARRAYS_PER_SCALE * scale).times do
  list = []
  text = +""
  rng.rand(100..3000).times do |k|
    list << k
    text << "x" * rng.rand(1..64)
  end
  grown += list.size + text.bytesize
end

threads = Array.new(THREADS) do |t|
  Thread.new do
    local = Random.new(7 + t)
    parts = []
    (THREAD_ITEMS_PER_SCALE * scale).times do |i|
      parts << "#{i}-" * local.rand(1..60)
      parts = [parts.join("|")[-100..]] if parts.size > 500
    end
    Digest::SHA256.hexdigest(parts.join)
  end
end
threads.each { |thread| digest << thread.value }

puts "kept=#{store.size} rendered=#{rendered} grown=#{grown} sha256=#{digest.hexdigest[0, 16]}"
