// Intrusive doubly linked list: nodes live inside the objects listed, so linking never allocates.
#pragma once

#include <cstddef>

namespace meshalloc {

struct ListNode {
  ListNode* prev = nullptr;
  ListNode* next = nullptr;
  bool linked() const { return next != nullptr; }
};

// T must derive from ListNode (single inheritance, so the node is at a fixed offset).
template <typename T>
class IntrusiveList {
 public:
  // Constant-initialised (the sentinel links itself on first insertion): lists live in
  // statics that malloc may reach before any dynamic initialiser of this library has run.
  constexpr IntrusiveList() = default;
  IntrusiveList(const IntrusiveList&) = delete;
  IntrusiveList& operator=(const IntrusiveList&) = delete;

  bool empty() const { return head_.next == nullptr || head_.next == &head_; }
  size_t size() const { return size_; }

  void pushFront(T* item) { insertAfter(&head_, item); }
  void pushBack(T* item) { insertAfter(head_.prev, item); }

  void remove(T* item) {
    ListNode* node = item;
    node->prev->next = node->next;
    node->next->prev = node->prev;
    node->prev = node->next = nullptr;
    size_--;
  }

  T* front() const { return empty() ? nullptr : static_cast<T*>(head_.next); }
  T* back() const { return empty() ? nullptr : static_cast<T*>(head_.prev); }
  T* next(T* item) const {
    ListNode* node = static_cast<ListNode*>(item)->next;
    return node == &head_ ? nullptr : static_cast<T*>(node);
  }

  T* popFront() {
    T* item = front();
    if (item) remove(item);
    return item;
  }

 private:
  void insertAfter(ListNode* position, T* item) {
    if (head_.next == nullptr) head_.prev = head_.next = &head_;
    if (position == nullptr) position = &head_;
    ListNode* node = item;
    node->prev = position;
    node->next = position->next;
    position->next->prev = node;
    position->next = node;
    size_++;
  }

  ListNode head_;
  size_t size_ = 0;
};

}  // namespace meshalloc
