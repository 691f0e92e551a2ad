/*
 * common.S: the one path every trampoline of the trace library takes (x86-64 System V).
 *
 * A trampoline pushes its index and jumps here. The argument registers (and rax, the vector-register count of a
 * variadic call, and r10) are saved, trace_hit(index) counts the call and returns the real function, the registers
 * are restored and the real function is entered by a tail jump with the caller's stack and return address exactly as
 * they were: any signature is forwarded unchanged.
 */
	.text
	.globl trace_common
	.hidden trace_common
	.type trace_common,@function
	.p2align 4
trace_common:
	/* rsp: index, then the caller's return address. rsp is 16-byte aligned here (8 for the return address, 8 for
	 * the index); eight pushes and 128 bytes keep it aligned for the call. */
	pushq %rax
	pushq %rdi
	pushq %rsi
	pushq %rdx
	pushq %rcx
	pushq %r8
	pushq %r9
	pushq %r10
	subq $128, %rsp
	movdqu %xmm0, 0(%rsp)
	movdqu %xmm1, 16(%rsp)
	movdqu %xmm2, 32(%rsp)
	movdqu %xmm3, 48(%rsp)
	movdqu %xmm4, 64(%rsp)
	movdqu %xmm5, 80(%rsp)
	movdqu %xmm6, 96(%rsp)
	movdqu %xmm7, 112(%rsp)
	movq 192(%rsp), %rdi
	call trace_hit
	movq %rax, %r11
	movdqu 0(%rsp), %xmm0
	movdqu 16(%rsp), %xmm1
	movdqu 32(%rsp), %xmm2
	movdqu 48(%rsp), %xmm3
	movdqu 64(%rsp), %xmm4
	movdqu 80(%rsp), %xmm5
	movdqu 96(%rsp), %xmm6
	movdqu 112(%rsp), %xmm7
	addq $128, %rsp
	popq %r10
	popq %r9
	popq %r8
	popq %rcx
	popq %rdx
	popq %rsi
	popq %rdi
	popq %rax
	addq $8, %rsp
	jmp *%r11
	.size trace_common,.-trace_common
	.section .note.GNU-stack,"",@progbits
